// Hosting one actor instance: its name and log prefix, its state directory, its link to the
// coordinator (registration, heartbeats, run state, lookups) and its role's main function.
//
// `orrery actor ROLE` calls RunActor on its main thread (one process per actor); ActorThread runs
// the same thing on a thread (inproc:// endpoints, tests, single-process mode).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "actors/runtime/cancellation.h"
#include "actors/runtime/role.h"
#include "core/status.h"

namespace orrery {

struct ActorHostOptions {
  std::string role;
  int index = 0;
  std::string endpoint;              // the mailbox address given to the role
  std::string coordinator;           // the coordinator's endpoint; "" runs standalone
  std::string config_path;           // "" for none
  std::string config_dir;            // relative paths in the config resolve here ("": its dir)
  std::string run_dir = "runs/run";  // state_dir = <run_dir>/actors/<role>-<index>
  std::chrono::milliseconds heartbeat{500};
  // > 0: a ProgressWatchdog ends the *process* once the role's progress counter has not advanced
  // for this long (actors/runtime/progress_watchdog.h). For `orrery actor`, whose process is the
  // actor; leave it 0 with ActorThread.
  std::chrono::milliseconds progress_timeout{0};
};

// Runs the role's main function on the calling thread until it returns (it returns when `stop`
// is cancelled, or when the coordinator announces the fleet is stopping). Errors: unknown role,
// bad config file, the main function's own error.
//
// A coordinator that stops answering does not end the actor: it keeps serving, logs one warning
// per outage and registers again when a coordinator answers (a Kubernetes coordinator pod that
// restarts in place, a launcher busy for a moment). Exiting instead would spend every instance's
// restart budget (or, on a clean exit, finish its Job index for good) while a coordinator
// restarts. A coordinator that is gone for good ends the actors by other means: `orrery launch`
// through PR_SET_PDEATHSIG, the Slurm batch script by stopping the job's steps, under Kubernetes
// deleting the fleet's Jobs; see docs/launch.md.
Status RunActor(zmq::context_t& zmq, const ActorHostOptions& options, Cancellation& stop);

class ActorThread {
 public:
  // Starts RunActor on a new thread. `zmq` must outlive the thread (inproc peers share it).
  static std::unique_ptr<ActorThread> Start(zmq::context_t& zmq, ActorHostOptions options);
  ~ActorThread();  // Stop()

  // Cancels the actor, waits for it, and returns what its main returned.
  Status Stop();
  // True once the main function has returned (crashed actors included).
  bool finished() const { return finished_.load(); }

 private:
  ActorThread() = default;
  Cancellation stop_;
  std::thread thread_;
  Status result_;
  std::atomic<bool> finished_{false};
};

}  // namespace orrery
