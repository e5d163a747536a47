#include "actors/coordinator/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "actors/runtime/progress_watchdog.h"
#include "actors/runtime/wire.h"
#include "core/logging.h"

namespace orrery {
namespace {

using Clock = std::chrono::steady_clock;

std::string DescribeExit(int wstatus) {
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == kNoProgressExitCode) {
    return "exit " + std::to_string(kNoProgressExitCode) +
           ": its watchdog saw no progress for fleet.progress_timeout_ms";
  }
  if (WIFEXITED(wstatus)) return "exit " + std::to_string(WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    const int sig = WTERMSIG(wstatus);
    return "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "status " + std::to_string(wstatus);
}

}  // namespace

StatusOr<RestartPolicy> ParseRestartPolicy(const std::string& text) {
  if (text == "always") return RestartPolicy::kAlways;
  if (text == "on-failure") return RestartPolicy::kOnFailure;
  if (text == "never") return RestartPolicy::kNever;
  return InvalidArgumentError("restart policy '" + text +
                              "': expected one of always, on-failure, never");
}

Supervisor::Supervisor(FleetState& fleet, SupervisorOptions options, std::vector<ProcessSpec> specs)
    : fleet_(fleet), options_(std::move(options)) {
  for (ProcessSpec& spec : specs) {
    ActorRecord record;
    record.name = spec.name;
    record.role = spec.role;
    record.index = spec.index;
    record.endpoint = spec.endpoint;
    record.supervised = true;
    fleet_.Expect(record);
    Child child;
    child.spec = std::move(spec);
    children_.push_back(std::move(child));
  }
}

Supervisor::~Supervisor() {
  for (Child& c : children_) {
    if (c.pid > 0) {
      kill(-c.pid, SIGKILL);
      waitpid(c.pid, nullptr, 0);
      c.pid = 0;
    }
  }
}

Status Supervisor::Spawn(Child& child) {
  std::vector<char*> argv;
  for (std::string& a : child.spec.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork for " + child.spec.name, errno);
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the supervisor died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    execv(argv[0], argv.data());
    const char msg[] = "orrery launch: exec of the actor binary failed\n";
    [[maybe_unused]] ssize_t n = write(2, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also here: whichever side runs first
  child.pid = pid;
  child.started = Clock::now();
  child.kill_reason.clear();
  fleet_.MarkSpawned(child.spec.name, pid);
  ORRERY_LOG(INFO) << "started " << child.spec.name << " (pid " << pid << ")";
  return Status::OK();
}

void Supervisor::Reap(bool stopping, Status* failure) {
  while (true) {
    // Peek first (WNOWAIT leaves the child a zombie): while it is unreaped its pid, which is
    // also its group's id, cannot be given to another process, so the group kill below cannot
    // hit a stranger. Only then reap it.
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    const pid_t pid = info.si_pid;
    auto it = std::find_if(children_.begin(), children_.end(),
                           [pid](const Child& c) { return c.pid == pid; });
    if (it != children_.end()) kill(-pid, SIGKILL);  // whatever the actor started dies with it
    int wstatus = 0;
    if (waitpid(pid, &wstatus, 0) != pid) return;
    if (it == children_.end()) continue;
    Child& c = *it;
    c.pid = 0;
    std::string how = DescribeExit(wstatus);
    if (!c.kill_reason.empty()) how = c.kill_reason + " (" + how + ")";
    const bool clean = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
    if (stopping) {
      fleet_.MarkDown(c.spec.name, ActorState::kStopped, how, false);
      c.done = true;
      continue;
    }
    if (clean && c.spec.restart != RestartPolicy::kAlways) {
      ORRERY_LOG(INFO) << c.spec.name << " finished (" << how << ")";
      fleet_.MarkDown(c.spec.name, ActorState::kExited, how, false);
      c.done = true;
      continue;
    }
    if (c.spec.restart == RestartPolicy::kNever) {
      ORRERY_LOG(ERROR) << c.spec.name << " ended (" << how << ") and is not restarted";
      fleet_.MarkDown(c.spec.name, ActorState::kFailed, how, false);
      c.done = c.failed = true;
      if (failure->ok()) *failure = UnavailableError("actor " + c.spec.name + " ended: " + how);
      continue;
    }
    const auto now = Clock::now();
    c.restarts.erase(
        std::remove_if(c.restarts.begin(), c.restarts.end(),
                       [&](Clock::time_point t) { return now - t > options_.restart_window; }),
        c.restarts.end());
    if (static_cast<int>(c.restarts.size()) >= options_.restart_budget) {
      ORRERY_LOG(ERROR) << c.spec.name << " ended (" << how << "): restart budget spent";
      fleet_.MarkDown(c.spec.name, ActorState::kFailed, how, false);
      c.done = c.failed = true;
      if (failure->ok()) {
        *failure = ResourceExhaustedError("actor " + c.spec.name + " was restarted " +
                                          std::to_string(c.restarts.size()) + " times within " +
                                          std::to_string(options_.restart_window.count()) +
                                          " s (fleet.restart_budget) and ended again: " + how);
      }
      continue;
    }
    c.restarts.push_back(now);
    std::chrono::milliseconds backoff =
        options_.backoff_initial * (int64_t{1} << std::min<size_t>(c.restarts.size() - 1, 20));
    backoff = std::min(backoff, options_.backoff_max);
    c.restart_at = now + backoff;
    fleet_.MarkDown(c.spec.name, ActorState::kBackoff, how, true);
    ORRERY_LOG(WARN) << c.spec.name << " ended (" << how << "); restarting in " << backoff.count()
                     << " ms (restart " << c.restarts.size() << " of " << options_.restart_budget
                     << " allowed in " << options_.restart_window.count() << " s)";
  }
}

void Supervisor::CheckLiveness() {
  const auto now = Clock::now();
  const int64_t now_ms = UnixMillis();
  for (Child& c : children_) {
    if (c.pid <= 0 || !c.kill_reason.empty()) continue;
    std::optional<ActorRecord> r = fleet_.Get(c.spec.name);
    if (!r) continue;
    std::string reason;
    if (r->last_heartbeat_ms == 0) {
      if (now - c.started > options_.startup_timeout) {
        reason =
            "no registration within " + std::to_string(options_.startup_timeout.count()) + " ms";
      }
    } else if (now_ms - r->last_heartbeat_ms > options_.heartbeat_timeout.count()) {
      reason = "no heartbeat for " + std::to_string(now_ms - r->last_heartbeat_ms) + " ms";
    } else if (options_.progress_timeout.count() > 0 && r->last_progress_ms != 0 &&
               now_ms - r->last_progress_ms >
                   options_.progress_timeout.count() + options_.heartbeat_timeout.count()) {
      reason = "no progress for " + std::to_string(now_ms - r->last_progress_ms) +
               " ms (counter at " + std::to_string(r->progress) + ", fleet.progress_timeout_ms " +
               std::to_string(options_.progress_timeout.count()) + ")";
    }
    if (!reason.empty()) {
      ORRERY_LOG(WARN) << c.spec.name << ": " << reason << "; killing it";
      c.kill_reason = reason;
      kill(-c.pid, SIGKILL);
    }
  }
}

void Supervisor::Shutdown() {
  fleet_.SetStopping();
  int running = 0;
  for (Child& c : children_) {
    if (c.pid > 0) {
      kill(-c.pid, SIGTERM);
      ++running;
    } else if (!c.done) {  // waiting for a restart: it stays down
      std::optional<ActorRecord> r = fleet_.Get(c.spec.name);
      fleet_.MarkDown(c.spec.name, ActorState::kStopped, r ? r->last_exit : "", false);
      c.done = true;
    }
  }
  if (running > 0) ORRERY_LOG(INFO) << "stopping " << running << " actors";
  Status ignored;
  const auto deadline = Clock::now() + options_.shutdown_grace;
  while (Clock::now() < deadline) {
    Reap(/*stopping=*/true, &ignored);
    if (std::none_of(children_.begin(), children_.end(), [](const Child& c) { return c.pid > 0; }))
      break;
    usleep(10000);
  }
  for (Child& c : children_) {
    if (c.pid > 0) {
      ORRERY_LOG(WARN) << c.spec.name << " did not stop within " << options_.shutdown_grace.count()
                       << " ms; killing it";
      kill(-c.pid, SIGKILL);
      int wstatus = 0;
      waitpid(c.pid, &wstatus, 0);
      fleet_.MarkDown(c.spec.name, ActorState::kStopped, DescribeExit(wstatus), false);
      c.pid = 0;
    }
  }
}

Status Supervisor::Run(const Cancellation& stop) {
  Status failure;
  for (Child& c : children_) {
    Status s = Spawn(c);
    if (!s.ok()) {
      failure = s;
      break;
    }
  }
  auto next_report = Clock::now();
  while (failure.ok() && !stop.cancelled()) {
    Reap(/*stopping=*/false, &failure);
    if (!failure.ok()) break;
    const auto now = Clock::now();
    for (Child& c : children_) {
      if (c.pid == 0 && !c.done && now >= c.restart_at) {
        Status s = Spawn(c);
        if (!s.ok()) failure = s;
      }
    }
    CheckLiveness();
    if (options_.report && now >= next_report) {
      options_.report();
      next_report = now + options_.report_interval;
    }
    if (std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.done; })) {
      ORRERY_LOG(INFO) << "every actor has finished";
      break;
    }
    stop.WaitFor(std::chrono::milliseconds(20));
  }
  Shutdown();
  if (options_.report) options_.report();
  return failure;
}

}  // namespace orrery
