#include "env/sandbox/sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "env/sandbox/bwrap_tree.h"
#include "env/sandbox/seccomp_filter.h"

namespace orrery::env {
namespace {

namespace fs = std::filesystem;

struct Spawned {
  int pid = -1;
  int in = -1, out = -1, err = -1;
};

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// fork + exec of bwrap with the pipes, the uid switch and the rlimits. Everything the child needs
// is prepared before fork(): after it, only async-signal-safe system calls run.
// With `cgroup_procs_fd` >= 0 the child moves itself into that cgroup first.
StatusOr<Spawned> Spawn(const std::vector<std::string>& argv, uint32_t uid,
                        const SandboxLimits& limits, int seccomp_fd, int cgroup_procs_fd) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const std::string seccomp_path = "/proc/self/fd/" + std::to_string(seccomp_fd);
  struct Limit {
    int resource;
    rlim_t value;
  };
  // bwrap's own processes (the outer one and the namespace init) count towards RLIMIT_NPROC. In a
  // cgroup, pids.max holds the sandbox to processes + 3 and says when it did; RLIMIT_NPROC, twice
  // that, stays as the backstop per host uid (a uid the episode's isolated runs share).
  const rlim_t nproc = static_cast<rlim_t>(limits.processes + 3) * (cgroup_procs_fd >= 0 ? 2 : 1);
  const Limit rlimits[] = {{RLIMIT_CPU, static_cast<rlim_t>(limits.cpu_seconds)},
                           {RLIMIT_AS, static_cast<rlim_t>(limits.address_space_bytes)},
                           {RLIMIT_FSIZE, static_cast<rlim_t>(limits.file_size_bytes)},
                           {RLIMIT_NOFILE, static_cast<rlim_t>(limits.open_files)},
                           {RLIMIT_NPROC, nproc},
                           {RLIMIT_CORE, 0}};
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) return ErrnoError("pipe", errno);
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]), close(in[1]);
    return ErrnoError("pipe", errno);
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    return ErrnoError("pipe", errno);
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) close(fd);
    return ErrnoError("fork", e);
  }
  if (pid == 0) {
    // Child. Into the cgroup before anything else (the fd may be one dup2 replaces below).
    if (cgroup_procs_fd >= 0 && write(cgroup_procs_fd, "0", 1) != 1) _exit(123);
    // A fresh open file description of the filter (its own offset), at fd 3.
    const int filter = open(seccomp_path.c_str(), O_RDONLY);
    if (filter < 0 || dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0 ||
        dup2(filter, 3) < 0) {
      _exit(127);
    }
    syscall(SYS_close_range, 4u, ~0u, 0u);
    setpgid(0, 0);
    if (uid != 0) {
      if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) _exit(126);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // after setuid, which clears it
    if (getppid() != parent) _exit(125);
    for (const Limit& l : rlimits) {
      struct rlimit r = {l.value, l.value};
      if (setrlimit(l.resource, &r) != 0) _exit(124);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(in[0]), close(out[1]), close(err[1]);
  setpgid(pid, pid);  // also done in the child; whichever runs first wins the race harmlessly
  fcntl(in[1], F_SETFL, O_NONBLOCK);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  return Spawned{pid, in[1], out[0], err[0]};
}

int PollTimeoutMs(Deadline deadline) {
  const double left = SecondsLeft(deadline);
  if (left <= 0) return 0;
  return left > 3600 ? 3600 * 1000 : static_cast<int>(left * 1000) + 1;
}

// Appends what is readable on fd to *out up to `cap` bytes (the rest is read and dropped).
// Returns false at end of file.
bool ReadAvailable(int fd, std::string* out, size_t cap, bool* truncated) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      const size_t room = out->size() < cap ? cap - out->size() : 0;
      out->append(buf, std::min(room, static_cast<size_t>(n)));
      if (static_cast<size_t>(n) > room && truncated) *truncated = true;
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

bool SafeRelativePath(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  for (const auto& part : fs::path(p)) {
    if (part == "..") return false;
  }
  return true;
}

// The range index k this process holds (see sandbox.h): the first lock file under `dir` it can
// flock. The descriptor stays open (and the lock held) until the process exits. A child forked
// after the claim (its pid differs) claims a range of its own: the parent's lock, shared through
// the inherited descriptor, is the parent's.
StatusOr<uint32_t> ClaimUidRange(const std::string& dir, uint32_t ranges) {
  static std::mutex mu;
  static std::optional<uint32_t> claimed;
  static pid_t claimed_by = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (claimed && claimed_by == getpid()) return *claimed;
  std::error_code ec;
  fs::create_directories(dir, ec);
  for (uint32_t k = 0; k < ranges; ++k) {
    const std::string path = dir + "/range-" + std::to_string(k) + ".lock";
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return ErrnoError("sandbox: open uid range lock " + path, errno);
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      claimed = k;
      claimed_by = getpid();
      return k;
    }
    close(fd);
  }
  return ResourceExhaustedError("sandbox: all " + std::to_string(ranges) +
                                " host uid ranges under " + dir +
                                " are held by other Orrery processes");
}

// Mounts a tmpfs of `bytes` owned by `uid` on `dir`; false when this process may not mount.
StatusOr<bool> MountWorkTmpfs(const std::string& dir, uint32_t uid, int64_t bytes) {
  const std::string data = "size=" + std::to_string(bytes) +
                           ",mode=0700,uid=" + std::to_string(uid) + ",gid=" + std::to_string(uid);
  if (mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, data.c_str()) == 0) return true;
  if (errno == EPERM) return false;
  return ErrnoError("sandbox: mount a tmpfs on " + dir, errno);
}

// How the run ended (RunResult::Describe without the forks refused).
std::string DescribeEnd(const RunResult& r) {
  if (!r.limit_exceeded.empty()) return "killed: " + r.limit_exceeded;
  if (r.timed_out)
    return "timed out after " + std::to_string(static_cast<int>(r.wall_seconds)) + " s";
  if (r.signal != 0) {
    std::string s = "killed by signal " + std::to_string(r.signal);
    if (r.signal == SIGXCPU) s += " (CPU time limit)";
    if (r.signal == SIGXFSZ) s += " (file size limit)";
    return s;
  }
  return "exit " + std::to_string(r.exit_code);
}

}  // namespace

std::string RunResult::Describe() const {
  std::string s = DescribeEnd(*this);
  if (forks_refused > 0) {
    s += " (" + std::to_string(forks_refused) + " forks refused at the process limit)";
  }
  return s;
}

StatusOr<std::unique_ptr<Sandbox>> Sandbox::Create(const SandboxOptions& options, uint32_t slot) {
  // Writes to a pipe whose reader died must fail with EPIPE, not kill Orrery.
  signal(SIGPIPE, SIG_IGN);
  if (access(options.bwrap.c_str(), X_OK) != 0) {
    return FailedPreconditionError("sandbox: bubblewrap not found at " + options.bwrap +
                                   " (install the 'bubblewrap' package: scripts/setup.sh)");
  }
  std::string tmpl = options.scratch_root + "/orrery-sandbox-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr)
    return ErrnoError("sandbox: mkdtemp in " + options.scratch_root, errno);
  uint32_t uid = 0;
  bool mounted = false;
  const auto fail = [&](Status status) {
    if (mounted) umount2(tmpl.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(tmpl, ec);
    return status;
  };
  if (geteuid() == 0) {
    StatusOr<uint32_t> range = ClaimUidRange(options.uid_lock_dir, options.uid_ranges);
    if (!range.ok()) return fail(range.status());
    uid = options.uid_base + *range * 4096 + slot % 4096;
    StatusOr<bool> m = MountWorkTmpfs(tmpl, uid, options.limits.work_bytes);
    if (!m.ok()) return fail(m.status());
    mounted = *m;
    if (!mounted && chown(tmpl.c_str(), uid, uid) != 0) {
      return fail(ErrnoError("sandbox: chown " + tmpl, errno));
    }
  }
  StatusOr<std::optional<std::string>> cgroup = SandboxCgroupParent(options.cgroup);
  if (!cgroup.ok()) return fail(cgroup.status());
  StatusOr<int> fd = MakeSeccompFilterFd();
  if (!fd.ok()) return fail(fd.status());
  return std::unique_ptr<Sandbox>(
      new Sandbox(options, slot, uid, tmpl, mounted, *fd, *std::move(cgroup)));
}

StatusOr<std::unique_ptr<SandboxCgroup>> Sandbox::MakeCgroup(const SandboxLimits& limits) const {
  if (!cgroup_parent_) return std::unique_ptr<SandboxCgroup>();
  // pids.max counts bwrap's own processes, as RLIMIT_NPROC does (Spawn).
  return SandboxCgroup::Create(
      *cgroup_parent_, CgroupCaps{limits.memory_bytes, limits.processes + 3, limits.cpu_cores});
}

Sandbox::~Sandbox() {
  if (seccomp_fd_ >= 0) close(seccomp_fd_);
  if (work_mounted_) umount2(work_dir_.c_str(), MNT_DETACH);
  std::error_code ec;
  fs::remove_all(work_dir_, ec);
}

Status Sandbox::WriteFile(const std::string& relative_path, const std::string& contents) {
  if (!SafeRelativePath(relative_path)) {
    return InvalidArgumentError("sandbox: '" + relative_path +
                                "' is not a relative path inside the work dir");
  }
  const fs::path path = fs::path(work_dir_) / relative_path;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("sandbox: open " + path.string(), errno);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      const int e = errno;
      close(fd);
      return ErrnoError("sandbox: write " + path.string(), e);
    }
    done += static_cast<size_t>(n);
  }
  if (uid_ != 0 && fchown(fd, uid_, uid_) != 0) {
    const int e = errno;
    close(fd);
    return ErrnoError("sandbox: chown " + path.string(), e);
  }
  close(fd);
  return Status::OK();
}

Status Sandbox::Reset() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(work_dir_, ec)) {
    fs::remove_all(entry.path(), ec);  // does not follow symlinks
    if (ec) return IoError("sandbox: cannot empty " + work_dir_ + ": " + ec.message());
  }
  if (ec) return IoError("sandbox: cannot list " + work_dir_ + ": " + ec.message());
  return Status::OK();
}

std::vector<std::string> Sandbox::BwrapArgv(const std::vector<std::string>& argv) const {
  std::vector<std::string> a = {options_.bwrap, "--unshare-all", "--die-with-parent",
                                "--as-pid-1",   "--new-session", "--cap-drop",
                                "ALL",          "--uid",         "65534",
                                "--gid",        "65534",         "--hostname",
                                "sandbox",      "--ro-bind",     "/usr",
                                "/usr",         "--symlink",     "usr/lib",
                                "/lib",         "--symlink",     "usr/lib64",
                                "/lib64",       "--symlink",     "usr/bin",
                                "/bin",         "--symlink",     "usr/sbin",
                                "/sbin"};
  for (const char* etc : {"/etc/alternatives", "/etc/ld.so.cache", "/etc/ssl", "/etc/localtime"}) {
    if (access(etc, F_OK) == 0) a.insert(a.end(), {"--ro-bind", etc, etc});
  }
  a.insert(a.end(),
           {"--proc", "/proc", "--dev", "/dev", "--size", std::to_string(options_.limits.tmp_bytes),
            "--tmpfs", "/tmp", "--bind", work_dir_, "/work", "--chdir", "/work"});
  for (const auto& [host, inside] : options_.ro_binds)
    a.insert(a.end(), {"--ro-bind", host, inside});
  a.insert(a.end(), {"--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv",
                     "HOME", "/work", "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"});
  for (const auto& [k, v] : options_.env) a.insert(a.end(), {"--setenv", k, v});
  a.insert(a.end(), {"--seccomp", "3", "--"});
  a.insert(a.end(), argv.begin(), argv.end());
  return a;
}

StatusOr<RunResult> Sandbox::Run(const std::vector<std::string>& argv,
                                 const std::string& stdin_text, Deadline deadline) {
  if (argv.empty()) return InvalidArgumentError("sandbox: empty command");
  const auto start = Clock::now();
  const Deadline wall = std::min(deadline, DeadlineIn(options_.limits.wall_seconds));
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<SandboxCgroup> cgroup, MakeCgroup(options_.limits));
  ORRERY_ASSIGN_OR_RETURN(Spawned p, Spawn(BwrapArgv(argv), uid_, options_.limits, seccomp_fd_,
                                           cgroup ? cgroup->procs_fd() : -1));
  std::unique_ptr<TreeWatch> watch = WatchProcessTree(
      p.pid, options_.limits.memory_bytes, static_cast<double>(options_.limits.cpu_seconds),
      cgroup ? cgroup->dir() + "/memory.events" : "");
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, p.pid, 0));
  RunResult result;
  TreeLimit exceeded = TreeLimit::kNone;
  const size_t cap = static_cast<size_t>(options_.limits.output_bytes);
  size_t written = 0;
  if (stdin_text.empty()) CloseFd(p.in);
  bool exited = false;
  int status = 0;
  while (true) {
    pollfd fds[4];
    int n = 0;
    if (p.out >= 0) fds[n++] = {p.out, POLLIN, 0};
    if (p.err >= 0) fds[n++] = {p.err, POLLIN, 0};
    if (p.in >= 0) fds[n++] = {p.in, POLLOUT, 0};
    if (pidfd >= 0 && !exited) fds[n++] = {pidfd, POLLIN, 0};
    if (exited && p.out < 0 && p.err < 0) break;
    if (SecondsLeft(wall) <= 0) {
      result.timed_out = true;
      break;
    }
    // Without a pidfd, poll in 50 ms slices and check for exit with WNOHANG.
    const int timeout = pidfd >= 0 ? PollTimeoutMs(wall) : std::min(50, PollTimeoutMs(wall));
    if (poll(fds, n, timeout) < 0 && errno != EINTR) break;
    if (p.out >= 0 && !ReadAvailable(p.out, &result.stdout_text, cap, &result.output_truncated)) {
      CloseFd(p.out);
    }
    if (p.err >= 0 && !ReadAvailable(p.err, &result.stderr_text, cap, &result.output_truncated)) {
      CloseFd(p.err);
    }
    if (p.in >= 0) {
      const ssize_t w = write(p.in, stdin_text.data() + written, stdin_text.size() - written);
      if (w > 0) written += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == stdin_text.size()) {
        CloseFd(p.in);
      }
    }
    if (!exited) {
      // Checked without reaping (WNOWAIT): the watchdog may signal the pid until it is unwatched.
      siginfo_t info{};
      if (waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == p.pid) {
        exited = true;
        exceeded = watch->exceeded();
        watch.reset();
        waitpid(p.pid, &status, 0);
      }
      // The tree is gone with bwrap; what is left in the pipes is read on the next rounds.
    }
  }
  if (!exited) {
    KillBwrapTree(p.pid);
    exceeded = watch->exceeded();
    watch.reset();
    waitpid(p.pid, &status, 0);
  }
  CloseFd(p.in), CloseFd(p.out), CloseFd(p.err);
  if (pidfd >= 0) close(pidfd);
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.limit_exceeded = DescribeTreeLimit(exceeded, options_.limits.memory_bytes,
                                            static_cast<double>(options_.limits.cpu_seconds));
  if (cgroup) {
    const CgroupOutcome outcome = cgroup->Outcome();
    if (outcome.oom_killed) {
      result.limit_exceeded =
          DescribeTreeLimit(TreeLimit::kMemory, options_.limits.memory_bytes, 0) +
          " (cgroup memory.max)";
    }
    result.forks_refused = outcome.forks_refused;
  }
  if (!result.limit_exceeded.empty()) result.timed_out = false;
  if (result.timed_out) {
    result.signal = SIGKILL;
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
    // bwrap reports a child killed by signal N as exit 128 + N.
    if (result.exit_code > 128 && result.exit_code < 128 + 65) {
      result.signal = result.exit_code - 128;
      result.exit_code = -1;
    }
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

StatusOr<std::unique_ptr<SandboxProcess>> Sandbox::Start(const std::vector<std::string>& argv) {
  if (argv.empty()) return InvalidArgumentError("sandbox: empty command");
  SandboxLimits limits = options_.limits;
  // A server lives for the whole episode: its CPU limit is per process lifetime, so allow more.
  limits.cpu_seconds = std::max<int64_t>(limits.cpu_seconds, 3600);
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<SandboxCgroup> cgroup, MakeCgroup(limits));
  ORRERY_ASSIGN_OR_RETURN(Spawned p, Spawn(BwrapArgv(argv), uid_, limits, seccomp_fd_,
                                           cgroup ? cgroup->procs_fd() : -1));
  std::unique_ptr<SandboxProcess> proc(new SandboxProcess());
  proc->pid_ = p.pid;
  proc->stdin_fd_ = p.in;
  proc->stdout_fd_ = p.out;
  proc->stderr_fd_ = p.err;
  proc->stderr_cap_ = static_cast<size_t>(limits.output_bytes);
  proc->watch_ =
      WatchProcessTree(p.pid, limits.memory_bytes, static_cast<double>(limits.cpu_seconds),
                       cgroup ? cgroup->dir() + "/memory.events" : "");
  proc->cgroup_ = std::move(cgroup);
  return proc;
}

SandboxProcess::~SandboxProcess() { Kill(); }

void SandboxProcess::Kill() {
  if (pid_ > 0) {
    KillBwrapTree(pid_);
    watch_.reset();  // before the pid is reaped and may be reused
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    cgroup_.reset();
  }
  CloseFd(stdin_fd_), CloseFd(stdout_fd_), CloseFd(stderr_fd_);
}

void SandboxProcess::DrainStderr() {
  if (stderr_fd_ >= 0 && !ReadAvailable(stderr_fd_, &stderr_, stderr_cap_, nullptr)) {
    CloseFd(stderr_fd_);
  }
}

Status SandboxProcess::WriteLine(const std::string& line, Deadline deadline) {
  if (stdin_fd_ < 0) return UnavailableError("sandboxed process has exited");
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(stdin_fd_, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EPIPE) return UnavailableError("sandboxed process closed its stdin");
    if (n < 0 && errno != EAGAIN && errno != EINTR) return ErrnoError("write to sandbox", errno);
    if (SecondsLeft(deadline) <= 0)
      return DeadlineExceededError("sandboxed process is not reading its stdin");
    pollfd fd = {stdin_fd_, POLLOUT, 0};
    poll(&fd, 1, PollTimeoutMs(deadline));
  }
  return Status::OK();
}

StatusOr<std::string> SandboxProcess::ReadLine(Deadline deadline, size_t max_bytes) {
  for (;;) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (buffer_.size() > max_bytes) {
      return ResourceExhaustedError("sandboxed process wrote a line longer than " +
                                    std::to_string(max_bytes) + " bytes");
    }
    if (stdout_fd_ < 0) return UnavailableError("sandboxed process has exited");
    if (SecondsLeft(deadline) <= 0)
      return DeadlineExceededError("no reply from the sandboxed process before the deadline");
    pollfd fds[2] = {{stdout_fd_, POLLIN, 0}, {stderr_fd_, POLLIN, 0}};
    poll(fds, stderr_fd_ >= 0 ? 2 : 1, PollTimeoutMs(deadline));
    DrainStderr();
    if (!ReadAvailable(stdout_fd_, &buffer_, max_bytes + 2, nullptr)) {
      CloseFd(stdout_fd_);
    }
  }
}

}  // namespace orrery::env
