// Method names of the coordinator's mailbox (message types: actors/schema/actor.capnp). Shared by
// the coordinator (actors/coordinator) and the actors' side of the link (host.cc), and by any tool
// that talks to a running fleet.
#pragma once

namespace orrery::coordinator_methods {

inline constexpr char kRegister[] = "coordinator.Register";    // RegisterRequest -> HeartbeatReply
inline constexpr char kHeartbeat[] = "coordinator.Heartbeat";  // HeartbeatRequest -> HeartbeatReply
inline constexpr char kLookup[] = "coordinator.Lookup";        // LookupRequest -> LookupReply
inline constexpr char kSetRunState[] = "coordinator.SetRunState";  // SetRunStateRequest -> RunState
inline constexpr char kStatus[] = "coordinator.Status";            // Empty -> FleetStatus

}  // namespace orrery::coordinator_methods
