// The actor process's own liveness check: ends the process when its role's progress counter
// (ActorContext::Progress) stops advancing.
//
// Heartbeats come from a thread of their own, so a role whose main loop is stuck inside one call
// (a deadlock, a spin, a peer that never answers) keeps heartbeating. `orrery launch` supervises
// its children and kills such an instance, but under Slurm or Kubernetes (`--external`) nothing
// watches the counter; so every `orrery actor` process watches its own (--progress-timeout-ms,
// which every launcher passes from fleet.progress_timeout_ms). From the first advance on, a
// counter unchanged for `timeout` logs one line and ends the process with kNoProgressExitCode;
// the launcher's restart loop (the supervisor, the Slurm script's orrery_instance, the Job's
// restartPolicy) restarts it under the restart budget like any other failure.
//
// The process ends with _exit, as a SIGKILL would end it: a stuck thread may hold locks that
// destructors and atexit handlers need. Durable state is crash-safe by design (the same as for
// SIGKILL); the processes the actor started die through their own PR_SET_PDEATHSIG.
//
// Only time the watchdog itself was awake counts towards the timeout (each check adds at most a
// few check periods), so a process stopped with SIGSTOP (Slurm's suspend and gang scheduling) is
// not ended on resume for the time it was stopped.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace orrery {

// The exit status of an actor process its watchdog ended (EX_TEMPFAIL: a restart may help).
inline constexpr int kNoProgressExitCode = 75;

class ProgressWatchdog {
 public:
  // Watches `counter` (which must outlive the watchdog) on a thread of its own; `name` prefixes
  // its log line. `timeout` > 0.
  ProgressWatchdog(const std::atomic<uint64_t>& counter, std::chrono::milliseconds timeout,
                   std::string name);
  ~ProgressWatchdog();  // stops watching
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

 private:
  void Watch();

  const std::atomic<uint64_t>& counter_;
  const std::chrono::milliseconds timeout_;
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace orrery
