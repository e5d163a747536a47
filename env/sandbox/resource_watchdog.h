// The sandbox limits no rlimit can hold: memory and CPU time of all of a sandbox's processes
// together.
//
// RLIMIT_AS and RLIMIT_CPU bound each process; a sandbox may run `processes` of them, so without a
// cgroup (which this machine may not delegate) four processes of 600 MiB each are within every
// rlimit. The watchdog is one thread that, every `period`, walks each watched process tree (from
// bwrap's pid through /proc/<pid>/task/<tid>/children: the sandbox's pid namespace hangs below
// bwrap, and orphans are reparented to its init, which is inside the tree) and sums
//   - resident anonymous and shared memory (RssAnon + RssShmem of /proc/<pid>/status: what a
//     process allocated, not the binaries and libraries it maps), and
//   - CPU time (utime + stime + cutime + cstime of /proc/<pid>/stat, so a reaped child still
//     counts through its reaper).
// A tree over either limit is SIGKILLed as a whole (bwrap's process group; the pid namespace
// goes with it), and the watch records which limit ended it. Overshoot is bounded by what the
// processes can allocate in one period (10 ms by default) on top of the limit.
// When the tree runs in a cgroup of its own (cgroup.h), the kernel holds memory.max and kills one
// process over it; the watchdog then also reads the cgroup's memory.events every period and ends
// the whole tree, as above, once it shows an oom_kill.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace orrery::env {

enum class TreeLimit { kNone = 0, kMemory, kCpu };

// One watched process tree; unwatched when destroyed.
class TreeWatch {
 public:
  ~TreeWatch();
  TreeWatch(const TreeWatch&) = delete;
  TreeWatch& operator=(const TreeWatch&) = delete;
  // Which limit killed the tree (kNone while it is within both).
  TreeLimit exceeded() const { return state_->exceeded.load(); }
  // The peak memory the watchdog saw, in bytes.
  int64_t peak_memory_bytes() const { return state_->peak_memory.load(); }

  struct State {
    int root_pid = 0;
    int64_t memory_bytes = 0;   // 0: unlimited
    double cpu_seconds = 0;     // 0: unlimited
    std::string memory_events;  // the cgroup's memory.events, or "" without one
    std::atomic<TreeLimit> exceeded{TreeLimit::kNone};
    std::atomic<int64_t> peak_memory{0};
  };

 private:
  friend std::unique_ptr<TreeWatch> WatchProcessTree(int, int64_t, double, std::string);
  explicit TreeWatch(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// Watches the tree rooted at `root_pid` (a process group leader: the tree is killed as
// kill(-root_pid) plus kill(root_pid)). A limit of 0 is no limit. `memory_events`: the path of
// the tree's cgroup memory.events, or "".
std::unique_ptr<TreeWatch> WatchProcessTree(int root_pid, int64_t memory_bytes, double cpu_seconds,
                                            std::string memory_events = "");

// One line for a RunResult: "memory limit: 256 MiB for all processes together".
std::string DescribeTreeLimit(TreeLimit limit, int64_t memory_bytes, double cpu_seconds);

}  // namespace orrery::env
