// Supervisor: runs every actor of a fleet as a child process and keeps it running.
//
// Each child gets its own process group (a signal to the group also reaches what the actor
// started, e.g. sandboxed tools) and PR_SET_PDEATHSIG(SIGKILL), so no child outlives the
// supervisor even when the supervisor itself is SIGKILLed. A child that dies, that stops
// heartbeating for `heartbeat_timeout`, or whose progress counter (ActorContext::Progress, carried
// by its heartbeats) has not advanced for `progress_timeout` + `heartbeat_timeout` since it first
// advanced (a main loop stuck inside one call) is killed and restarted after an exponential
// backoff (initial, doubling per restart within the window, capped). A stalled child's own
// watchdog (actors/runtime/progress_watchdog.h, given the same progress_timeout) ends it first,
// with kNoProgressExitCode; the supervisor's deadline, one heartbeat timeout later, is the
// backstop for a process whose watchdog cannot run. More than `restart_budget` restarts of one
// instance within `restart_window` fail the fleet: everything is stopped and Run returns the
// error. Stopping (the `stop` token: SIGINT/SIGTERM in `orrery launch`) marks the run state
// "stopping", sends SIGTERM to every group, waits `shutdown_grace`, then SIGKILLs what is left and
// reaps every child before returning. A child's process group is killed while the child is still
// an unreaped zombie (so its pid, the group's id, cannot have been reused) and only then is the
// child reaped and its exit recorded.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "actors/coordinator/fleet_state.h"
#include "actors/runtime/cancellation.h"
#include "core/status.h"

namespace orrery {

enum class RestartPolicy {
  kAlways,     // restart after any exit (services: replay store, env workers)
  kOnFailure,  // a clean exit (status 0) ends the instance (jobs: a pretraining stage)
  kNever,      // any exit ends it; a failure fails the fleet
};
StatusOr<RestartPolicy> ParseRestartPolicy(const std::string& text);

struct ProcessSpec {
  std::string name;  // "replay:0"
  std::string role;
  int index = 0;
  std::string endpoint;
  std::vector<std::string> argv;  // argv[0]: the executable's path
  RestartPolicy restart = RestartPolicy::kAlways;
};

struct SupervisorOptions {
  std::chrono::milliseconds heartbeat_timeout{2000};
  std::chrono::milliseconds startup_timeout{30000};  // spawn -> first registration
  // Progress counter unchanged this long plus heartbeat_timeout (once it is non-zero) -> killed;
  // 0: not watched. The actors' own watchdogs end them at progress_timeout.
  std::chrono::milliseconds progress_timeout{120000};
  std::chrono::milliseconds backoff_initial{250};
  std::chrono::milliseconds backoff_max{10000};
  int restart_budget = 5;
  std::chrono::seconds restart_window{300};
  std::chrono::milliseconds shutdown_grace{5000};
  // Called every `report_interval` on the supervisor's thread (metrics, status files).
  std::chrono::milliseconds report_interval{1000};
  std::function<void()> report;
};

class Supervisor {
 public:
  Supervisor(FleetState& fleet, SupervisorOptions options, std::vector<ProcessSpec> specs);
  ~Supervisor();  // kills and reaps any child still running

  // Spawns every process and supervises until `stop` is cancelled (returns OK after a clean
  // shutdown), every instance has ended (OK; an error if one failed), or an instance exhausts
  // its restart budget (error, after stopping the rest).
  Status Run(const Cancellation& stop);

 private:
  struct Child {
    ProcessSpec spec;
    pid_t pid = 0;  // 0: not running
    std::chrono::steady_clock::time_point started;
    std::chrono::steady_clock::time_point restart_at;
    std::vector<std::chrono::steady_clock::time_point> restarts;  // within the window
    bool done = false;                                            // exited for good
    bool failed = false;
    std::string kill_reason;  // set when the supervisor killed it
  };

  Status Spawn(Child& child);
  void Reap(bool stopping, Status* failure);
  void CheckLiveness();
  void Shutdown();

  FleetState& fleet_;
  SupervisorOptions options_;
  std::vector<Child> children_;
};

}  // namespace orrery
