// The bubblewrap sandbox: where untrusted code and tool servers run.
//
// Every process started through a Sandbox runs as
//   bwrap --unshare-all --die-with-parent --new-session --cap-drop ALL --uid 65534 --gid 65534
//         --ro-bind /usr /usr (+ /lib /lib64 /bin /sbin symlinks, /etc/alternatives, ld.so.cache)
//         --proc /proc --dev /dev --size <tmp_bytes> --tmpfs /tmp --bind <private work dir> /work
//         --chdir /work --clearenv --seccomp <fd> -- argv...
// so it sees no host files beyond the read-only system binds and the ones the caller names, has
// no network beyond its own loopback (a fresh network namespace), no capabilities, cannot make
// any namespace (the seccomp filter of seccomp_filter.h; not bwrap's --disable-userns, see
// docs/env.md), and runs
// under the rlimits of SandboxLimits. Limits that hold for all of a sandbox's processes together:
//   - where a delegated cgroup v2 subtree exists (cgroup.h), each Run or Start is a cgroup of its
//     own: memory.max, pids.max and cpu.max hold in the kernel;
//   - memory and CPU time: the resource watchdog (resource_watchdog.h) kills the tree;
//   - processes: RLIMIT_NPROC counts per host uid, and each sandbox has its own (below);
//   - /tmp: a tmpfs of tmp_bytes, new for every process started;
//   - /work: when Orrery may mount (root), the private work dir is a tmpfs of work_bytes mounted
//     on the host for the sandbox's lifetime; otherwise only file_size_bytes per file holds.
// When Orrery runs as root, bwrap itself is started under a dedicated unprivileged host uid: this
// process claims a range of 4096 uids (uid_base + 4096 * k, the first k whose lock file under
// uid_lock_dir it can flock; held until it exits) and slot s of it is uid_base + 4096 * k + s.
// So RLIMIT_NPROC applies (the kernel exempts root) and is not shared with another sandbox or
// another Orrery process, and sandboxes cannot signal each other or Orrery.
// A wall-clock timeout (or the caller's deadline) kills the whole process tree: killing bwrap
// ends the sandbox's pid namespace, and with it every process started in it, also those left in
// the background. Output is captured up to a cap.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "env/sandbox/cgroup.h"
#include "env/sandbox/resource_watchdog.h"

namespace orrery::env {

struct SandboxLimits {
  double wall_seconds = 10;  // per Run(); the caller's deadline may cut it shorter
  // CPU seconds of all processes of one Run (or one Start) together; each process also has it as
  // RLIMIT_CPU.
  int64_t cpu_seconds = 10;
  int64_t memory_bytes = 2ll << 30;         // resident memory of all processes together (2 GiB)
  int64_t address_space_bytes = 1ll << 30;  // RLIMIT_AS, per process (1 GiB)
  int64_t tmp_bytes = 256ll << 20;          // the /tmp tmpfs
  int64_t work_bytes = 256ll << 20;         // the /work tmpfs (when Orrery may mount it)
  int64_t file_size_bytes = 16ll << 20;     // RLIMIT_FSIZE (16 MiB per file)
  int64_t open_files = 64;                  // RLIMIT_NOFILE
  int64_t processes = 32;                   // RLIMIT_NPROC (beyond bwrap's own)
  int64_t output_bytes = 64 << 10;          // captured stdout and stderr, each
  double cpu_cores = 2;                     // cpu.max bandwidth (only in a cgroup: cgroup.h)
};

struct SandboxOptions {
  SandboxLimits limits;
  std::string bwrap = "/usr/bin/bwrap";
  std::string scratch_root = "/tmp";  // where private work dirs are created
  // Extra read-only binds: host path -> path inside (files or directories).
  std::vector<std::pair<std::string, std::string>> ro_binds;
  // Extra environment variables inside (PATH, HOME=/work and LANG are always set).
  std::vector<std::pair<std::string, std::string>> env;
  // Host uids for sandboxes when running as root: see above (slot < 4096, range k < uid_ranges).
  uint32_t uid_base = 420000;
  uint32_t uid_ranges = 64;
  std::string uid_lock_dir = "/tmp/orrery-uid-ranges";
  // Where each Run/Start gets a cgroup of its own (cgroup.h): "auto" (a delegated cgroup v2
  // subtree when this machine has one, else none), "off", or a delegated cgroup v2 directory.
  std::string cgroup = "auto";
};

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // the terminating signal, or 0
  bool timed_out = false;
  bool output_truncated = false;
  // Set when the resource watchdog killed the tree: "memory limit: 256 MiB for all processes
  // together" (or the CPU time limit).
  std::string limit_exceeded;
  // Forks the cgroup's pids.max refused (0 without a cgroup, where RLIMIT_NPROC refuses them).
  int64_t forks_refused = 0;
  std::string stdout_text, stderr_text;
  double wall_seconds = 0;
  // "exit 0", "exit 1", "killed by signal 9", "timed out after 10 s", "killed: memory limit: ...",
  // with "(3 forks refused at the process limit)" appended when forks_refused > 0.
  std::string Describe() const;
};

class SandboxProcess;

class Sandbox {
 public:
  // Creates the private work dir and compiles the seccomp filter. `slot` picks the host uid (see
  // above); a pool gives each of its sandboxes its own slot.
  static StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxOptions& options, uint32_t slot);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  const SandboxOptions& options() const { return options_; }
  // Host path of the private work dir (mounted at /work inside).
  const std::string& work_dir() const { return work_dir_; }
  // Whether the work dir is a tmpfs of limits.work_bytes (Orrery could mount it).
  bool work_dir_capped() const { return work_mounted_; }
  // The host uid bwrap runs as (0: Orrery's own, when it is not root).
  uint32_t host_uid() const { return uid_; }
  // The slot it was created with (a second sandbox of the same slot shares its host uid).
  uint32_t slot() const { return slot_; }
  // The cgroup under which its runs get cgroups of their own (cgroup.h), or nullopt.
  const std::optional<std::string>& cgroup_parent() const { return cgroup_parent_; }

  // Writes `contents` to work_dir/relative_path (no "..", no absolute path).
  Status WriteFile(const std::string& relative_path, const std::string& contents);
  // Empties the work dir (for reuse by the next episode).
  Status Reset();
  // Replaces the extra read-only binds for the next runs (per-episode files such as a grader).
  void set_ro_binds(std::vector<std::pair<std::string, std::string>> binds) {
    options_.ro_binds = std::move(binds);
  }

  // Runs argv to completion with `stdin_text`, bounded by limits.wall_seconds and `deadline`.
  // A program that fails, crashes or times out is a RunResult; a Status error means the sandbox
  // itself could not run (bwrap missing, fork failed).
  StatusOr<RunResult> Run(const std::vector<std::string>& argv, const std::string& stdin_text,
                          Deadline deadline);
  // Starts argv as a long-running process speaking over stdin/stdout (environment servers, MCP).
  // Its wall-clock limit is the process lifetime: it is killed when the handle is destroyed.
  StatusOr<std::unique_ptr<SandboxProcess>> Start(const std::vector<std::string>& argv);

 private:
  Sandbox(SandboxOptions options, uint32_t slot, uint32_t uid, std::string work_dir,
          bool work_mounted, int seccomp_fd, std::optional<std::string> cgroup_parent)
      : options_(std::move(options)),
        slot_(slot),
        uid_(uid),
        work_dir_(std::move(work_dir)),
        work_mounted_(work_mounted),
        seccomp_fd_(seccomp_fd),
        cgroup_parent_(std::move(cgroup_parent)) {}
  // A cgroup for one process tree with these limits, or nullptr without a cgroup parent.
  StatusOr<std::unique_ptr<SandboxCgroup>> MakeCgroup(const SandboxLimits& limits) const;
  std::vector<std::string> BwrapArgv(const std::vector<std::string>& argv) const;

  SandboxOptions options_;
  uint32_t slot_;
  uint32_t uid_;  // host uid for bwrap when running as root; 0 means "keep ours"
  std::string work_dir_;
  bool work_mounted_;
  int seccomp_fd_;
  std::optional<std::string> cgroup_parent_;
};

// A running sandboxed process with pipes to its stdin and stdout (stderr is captured, capped).
class SandboxProcess {
 public:
  ~SandboxProcess();  // kills the process tree and reaps it
  // Writes `line` plus '\n'. DeadlineExceeded when the pipe stays full past the deadline.
  Status WriteLine(const std::string& line, Deadline deadline);
  // Reads one line (without '\n'), at most `max_bytes`. Unavailable when the process exited,
  // DeadlineExceeded on timeout, ResourceExhausted when the line is longer than max_bytes.
  StatusOr<std::string> ReadLine(Deadline deadline, size_t max_bytes = 16 << 20);
  // What the process wrote on stderr so far (capped at limits.output_bytes).
  const std::string& stderr_text() const { return stderr_; }
  // Kills the process tree now (idempotent).
  void Kill();
  bool running() const { return pid_ > 0; }

 private:
  friend class Sandbox;
  SandboxProcess() = default;
  void DrainStderr();

  int pid_ = -1;
  int stdin_fd_ = -1, stdout_fd_ = -1, stderr_fd_ = -1;
  std::string buffer_;  // stdout bytes read but not yet returned
  std::string stderr_;
  size_t stderr_cap_ = 0;
  std::unique_ptr<TreeWatch> watch_;       // memory and CPU of the whole tree
  std::unique_ptr<SandboxCgroup> cgroup_;  // removed after the tree is reaped
};

}  // namespace orrery::env
