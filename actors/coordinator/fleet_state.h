// FleetState: what the coordinator knows about the fleet: every actor instance (endpoint, state,
// pid, restarts, last heartbeat, progress counter and when it last advanced) and the shared run
// state. Thread-safe: the coordinator's mailbox thread answers registrations, heartbeats and
// lookups from it while the supervisor (the launch process's main thread) records spawns, exits and
// restarts.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime/role.h"
#include "core/metrics.h"
#include "core/status.h"

namespace orrery {

enum class ActorState {
  kStarting,  // spawned (or expected), not yet ready
  kRunning,   // registered and ready
  kBackoff,   // died; waiting to be restarted
  kExited,    // ended cleanly and is not restarted
  kFailed,    // out of restart budget (or restart = never)
  kStopped,   // stopped by a fleet shutdown
};
const char* ActorStateName(ActorState state);
// The `fleet/state` metric (docs/dashboard.md): 0 starting, 1 running, 2 restarting (kBackoff),
// 3 stopped (kExited, kStopped), 4 failed.
int DashboardStateCode(ActorState state);

struct ActorRecord {
  std::string name;  // "replay:0"
  std::string role;
  int index = 0;
  std::string endpoint;
  std::string host;
  int64_t pid = 0;
  ActorState state = ActorState::kStarting;
  int restarts = 0;
  int64_t last_heartbeat_ms = 0;  // Unix ms; 0 = never
  uint64_t progress = 0;          // the role's progress counter, as last heartbeated (0: none)
  int64_t last_progress_ms = 0;   // Unix ms when `progress` last changed; 0 = never
  std::string last_exit;          // "exit 1", "killed by signal 9", "heartbeat timeout"
  uint64_t auth_refused = 0;      // peers its CURVE sockets refused, over all its incarnations
  uint64_t auth_refused_incarnation = 0;  // of them, the current incarnation's (as heartbeated)
  bool supervised = false;                // spawned by this coordinator (else it registered itself)
};

class FleetState {
 public:
  // Declares an instance the supervisor will spawn (so status lists it before it registers).
  void Expect(const ActorRecord& record);

  // An actor announces itself (also after a restart, or after a coordinator restart).
  void Register(const std::string& name, const std::string& role, int index,
                const std::string& endpoint, const std::string& host, int64_t pid, bool ready,
                uint64_t progress, uint64_t auth_refused = 0);
  // Returns false when the name is unknown (the actor must register again). A `progress` other
  // than the one recorded stamps last_progress_ms. `auth_refused`: the process's count of refused
  // peers (actors/runtime/curve_auth.h), added to those of its earlier incarnations.
  bool Heartbeat(const std::string& name, int64_t pid, bool ready, uint64_t progress,
                 uint64_t auth_refused = 0);
  // The endpoint of a ready actor by name, or of the ready instance of a role with the fewest
  // lookups so far (spreads callers over instances).
  StatusOr<std::pair<std::string, std::string>> Lookup(const std::string& name_or_role);

  // Supervisor side.
  void MarkSpawned(const std::string& name, int64_t pid);
  void MarkDown(const std::string& name, ActorState state, const std::string& how,
                bool count_restart);
  std::optional<ActorRecord> Get(const std::string& name) const;

  RunState run_state() const;
  // "" / -1 keep a field.
  RunState SetRunState(const std::string& phase, int64_t stage, int64_t policy_version);
  void SetStopping();

  std::vector<ActorRecord> Snapshot() const;
  int64_t started_ms() const { return started_ms_; }

  // One metric record per actor, under the actor's own name as source (the source of its own
  // records, so the dashboard shows one row per actor, the replay store's too): fleet/state
  // (DashboardStateCode), fleet/restarts_total, heartbeat age and progress age (since the counter
  // last advanced) in seconds (-1 when never), pid, auth_refused (peers its CURVE sockets
  // refused); and a "coordinator" record with counts by state, the run state's stage and policy
  // version, and fleet/auth_refused_total: the actors' refusals plus `coordinator_auth_refused`
  // (the launch process's own sockets). No record sums the restarts: a sum() over actors does.
  std::vector<MetricRecord> ToMetrics(int64_t step, uint64_t coordinator_auth_refused = 0) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, ActorRecord> actors_;
  std::map<std::string, uint64_t> lookups_;
  RunState run_state_;
  int64_t started_ms_ = 0;
};

}  // namespace orrery
