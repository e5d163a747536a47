#include "env/sandbox/resource_watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "env/sandbox/bwrap_tree.h"
#include "env/sandbox/cgroup.h"

namespace orrery::env {
namespace {

constexpr std::chrono::milliseconds kPeriod{10};

struct Usage {
  int64_t memory_bytes = 0;
  double cpu_seconds = 0;
};

// Reads a small /proc file into buf (NUL-terminated); false when it is gone.
bool ReadProcFile(const std::string& path, char* buf, size_t size) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return false;
  const size_t n = std::fread(buf, 1, size - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  return n > 0;
}

// Adds pid's memory and CPU time to *usage and its children's pids to *pending.
void AddProcess(int pid, Usage* usage, std::vector<int>* pending) {
  static const double kTick = static_cast<double>(sysconf(_SC_CLK_TCK));
  char buf[4096];
  const std::string dir = "/proc/" + std::to_string(pid);
  if (ReadProcFile(dir + "/status", buf, sizeof buf)) {
    for (const char* key : {"RssAnon:", "RssShmem:"}) {
      const char* at = std::strstr(buf, key);
      long long kb = 0;
      if (at != nullptr && std::sscanf(at + std::strlen(key), "%lld", &kb) == 1) {
        usage->memory_bytes += kb * 1024;
      }
    }
  }
  if (ReadProcFile(dir + "/stat", buf, sizeof buf)) {
    // Fields after the command name (which may hold spaces) start at the last ')'.
    const char* rest = std::strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    long long cut = 0, cst = 0;
    // state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
    // cstime
    if (rest != nullptr &&
        std::sscanf(rest + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld",
                    &ut, &st, &cut, &cst) == 4) {
      usage->cpu_seconds += static_cast<double>(ut + st + cut + cst) / kTick;
    }
  }
  for (const pid_t child : ChildrenOf(pid)) pending->push_back(child);
}

Usage TreeUsage(int root_pid) {
  Usage usage;
  std::vector<int> pending = {root_pid};
  // A bound on the walk: a tree cannot hold more processes than the system does.
  for (size_t visited = 0; !pending.empty() && visited < 1 << 16; ++visited) {
    const int pid = pending.back();
    pending.pop_back();
    AddProcess(pid, &usage, &pending);
  }
  return usage;
}

class Watchdog {
 public:
  static Watchdog& Get() {
    static Watchdog* w = new Watchdog();  // never destroyed: its thread runs until exit
    return *w;
  }
  void Add(std::shared_ptr<TreeWatch::State> s) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.push_back(std::move(s));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    cv_.notify_one();
  }
  // Returns once no pass can signal the tree any more.
  void Remove(const TreeWatch::State* s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < watched_.size(); ++i) {
        if (watched_[i].get() == s) {
          watched_[i] = std::move(watched_.back());
          watched_.pop_back();
          break;
        }
      }
    }
    std::lock_guard<std::mutex> pass(pass_mu_);  // a pass in progress may still hold it
  }

 private:
  void Loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !watched_.empty(); });
      }
      {
        // Taken before the list is copied, so a tree removed meanwhile is not in this pass.
        std::lock_guard<std::mutex> pass(pass_mu_);
        std::vector<std::shared_ptr<TreeWatch::State>> now;
        {
          std::lock_guard<std::mutex> lock(mu_);
          now = watched_;
        }
        for (const auto& s : now) Check(*s);
      }
      std::this_thread::sleep_for(kPeriod);
    }
  }
  static void Check(TreeWatch::State& s) {
    if (s.exceeded.load() != TreeLimit::kNone) return;
    const Usage u = TreeUsage(s.root_pid);
    if (u.memory_bytes > s.peak_memory.load()) s.peak_memory.store(u.memory_bytes);
    TreeLimit over = TreeLimit::kNone;
    if (s.memory_bytes > 0 && u.memory_bytes > s.memory_bytes) over = TreeLimit::kMemory;
    if (s.cpu_seconds > 0 && u.cpu_seconds > s.cpu_seconds) over = TreeLimit::kCpu;
    char events[1024];
    if (!s.memory_events.empty() && ReadProcFile(s.memory_events, events, sizeof events) &&
        EventCount(events, "oom_kill") > 0) {
      over = TreeLimit::kMemory;
    }
    if (over == TreeLimit::kNone) return;
    s.exceeded.store(over);
    // The namespace's pid 1 first (env/sandbox/bwrap_tree.h); bwrap then exits by itself. Only a
    // bwrap with no child yet is killed here: the Run or the process that owns it reaps it.
    if (KillChildrenOf(s.root_pid) == 0) {
      kill(-s.root_pid, SIGKILL);
      kill(s.root_pid, SIGKILL);
    }
  }

  std::mutex mu_;       // guards watched_
  std::mutex pass_mu_;  // held while a pass checks (and may kill) trees
  std::condition_variable cv_;
  std::vector<std::shared_ptr<TreeWatch::State>> watched_;
  std::thread thread_;
};

}  // namespace

TreeWatch::~TreeWatch() { Watchdog::Get().Remove(state_.get()); }

std::unique_ptr<TreeWatch> WatchProcessTree(int root_pid, int64_t memory_bytes, double cpu_seconds,
                                            std::string memory_events) {
  auto state = std::make_shared<TreeWatch::State>();
  state->root_pid = root_pid;
  state->memory_bytes = memory_bytes;
  state->cpu_seconds = cpu_seconds;
  state->memory_events = std::move(memory_events);
  Watchdog::Get().Add(state);
  return std::unique_ptr<TreeWatch>(new TreeWatch(std::move(state)));
}

std::string DescribeTreeLimit(TreeLimit limit, int64_t memory_bytes, double cpu_seconds) {
  switch (limit) {
    case TreeLimit::kMemory:
      return "memory limit: " + std::to_string(memory_bytes >> 20) +
             " MiB for all processes together";
    case TreeLimit::kCpu:
      return "CPU time limit: " + std::to_string(static_cast<int64_t>(cpu_seconds)) +
             " s for all processes together";
    case TreeLimit::kNone:
      break;
  }
  return "";
}

}  // namespace orrery::env
