// Caps in the kernel where the machine delegates a cgroup v2 subtree: each sandboxed process tree
// (one Sandbox::Run, one Sandbox::Start) in a cgroup of its own.
//
// The parent of those cgroups (SandboxCgroupParent, found once per process for "auto"):
//   1. $ORRERY_SANDBOX_CGROUP when set: a cgroup v2 directory delegated to Orrery ("off": none);
//   2. else the process's own cgroup: the "0::" line of /proc/self/cgroup, under the cgroup2 mount
//      of /proc/self/mountinfo.
// A directory is usable when its cgroup.controllers lists memory, pids and cpu, and this process
// can enable them in its cgroup.subtree_control and create a child there. A process's own cgroup
// fails the last steps unless it is a root or delegated to it (the kernel's "no internal
// processes" rule: a cgroup holding processes cannot give controllers to children), and so do
// machines whose controllers sit on cgroup v1 hierarchies; then the sandbox falls back to its
// rlimits, tmpfs sizes and resource watchdog (one log line, once per process; docs/env.md).
//
// Under a usable directory D each Orrery process makes D/orrery-<pid> (controllers enabled for its
// children; removed at exit when empty), and each process tree gets D/orrery-<pid>/run-<n> with
//   memory.max = memory_bytes, memory.swap.max = 0, memory.oom.group = 1 (all processes together;
//   an OOM kills the whole tree), pids.max = processes + 3 (bwrap's own), cpu.max = cpu_cores.
// bwrap is moved into it between fork and exec (its pid written to cgroup.procs), so every process
// of the sandbox is in it and, with bwrap's cgroup namespace, cannot leave it. After the tree ends,
// memory.events (oom_kill) and pids.events (max) say which cap hit; cgroup.kill ends what is
// left, and the cgroup is removed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace orrery::env {

// The cgroup v2 path of /proc/self/cgroup's text (the "0::<path>" line), or nullopt.
std::optional<std::string> CgroupV2Path(std::string_view proc_self_cgroup);

// The host directory of cgroup v2 path `path` given /proc/self/mountinfo's text: the cgroup2
// mount whose root is `path` or above it, joined with the rest; nullopt without one.
std::optional<std::string> CgroupV2Dir(std::string_view mountinfo, const std::string& path);

// Whether a cgroup.controllers or cgroup.subtree_control text lists `controller`.
bool ListsController(std::string_view controllers, std::string_view controller);

// The count after `key` in a memory.events / pids.events text ("oom_kill 2" -> 2), or 0.
int64_t EventCount(std::string_view events, std::string_view key);

// cpu.max for `cores` CPUs: "<quota> 100000" (period 100 ms), or "max" for cores <= 0.
std::string CpuMaxValue(double cores);

// Checks `dir` (see above: controllers, subtree_control, a child) and creates this process's
// parent dir/orrery-<pid>; returns its path, or FailedPrecondition saying what was missing.
StatusOr<std::string> PrepareCgroupParent(const std::string& dir);

// This process's parent of sandbox cgroups for SandboxOptions::cgroup: "auto" (detected once, see
// above; nullopt when there is none, after one log line), "off" (nullopt), or a directory to use
// (prepared once; its failure is an error).
StatusOr<std::optional<std::string>> SandboxCgroupParent(const std::string& setting);

struct CgroupCaps {
  int64_t memory_bytes = 0;  // 0: no memory.max
  int64_t pids = 0;          // 0: no pids.max
  double cpu_cores = 0;      // 0: no cpu.max
};

// Which caps a cgroup's processes hit.
struct CgroupOutcome {
  bool oom_killed = false;    // memory.events oom_kill > 0
  int64_t forks_refused = 0;  // pids.events max
};

// One process tree's cgroup; killed and removed when destroyed.
class SandboxCgroup {
 public:
  // Creates parent/run-<n> with `caps`.
  static StatusOr<std::unique_ptr<SandboxCgroup>> Create(const std::string& parent,
                                                         const CgroupCaps& caps);
  ~SandboxCgroup();
  SandboxCgroup(const SandboxCgroup&) = delete;
  SandboxCgroup& operator=(const SandboxCgroup&) = delete;

  const std::string& dir() const { return dir_; }
  // An O_WRONLY descriptor of cgroup.procs: writing "0" to it moves the writer in (the child
  // between fork and exec). Owned by this object.
  int procs_fd() const { return procs_fd_; }
  // Reads memory.events and pids.events.
  CgroupOutcome Outcome() const;

 private:
  SandboxCgroup(std::string dir, int procs_fd) : dir_(std::move(dir)), procs_fd_(procs_fd) {}
  std::string dir_;
  int procs_fd_;
};

}  // namespace orrery::env
