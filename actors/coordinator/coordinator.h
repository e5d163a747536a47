// The coordinator's mailbox: answers registrations, heartbeats, lookups, run-state changes and
// status queries from a FleetState (methods: actors/runtime/coordinator_protocol.h). It runs on
// its own thread inside the launch process, beside the supervisor that spawns the actors.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "actors/coordinator/fleet_state.h"
#include "actors/runtime/actor.h"
#include "actors/runtime/cancellation.h"
#include "core/status.h"

namespace orrery {

class CoordinatorServer {
 public:
  // Binds `endpoint` (errors name it: address in use, unreachable host) and starts serving.
  static StatusOr<std::unique_ptr<CoordinatorServer>> Start(zmq::context_t& zmq,
                                                            const std::string& endpoint,
                                                            FleetState& state);
  ~CoordinatorServer();  // Stop()
  void Stop();
  // The bound address (tcp port 0 resolved).
  const std::string& endpoint() const { return actor_->endpoint(); }

 private:
  CoordinatorServer() = default;
  std::unique_ptr<Actor> actor_;
  Cancellation stop_;
  std::thread thread_;
};

}  // namespace orrery
