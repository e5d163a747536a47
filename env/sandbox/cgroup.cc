#include "env/sandbox/cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "core/logging.h"

namespace orrery::env {
namespace {

constexpr const char* kControllers[] = {"memory", "pids", "cpu"};

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' &&
        s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out.push_back(
          static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `text` to an existing cgroup interface file (created when missing, for fixtures).
Status WriteCgroupFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cgroup: open " + path, errno);
  const ssize_t n = write(fd, text.data(), text.size());
  const int e = errno;
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return ErrnoError("cgroup: write '" + text + "' to " + path, n < 0 ? e : EIO);
  }
  return Status::OK();
}

// Enables every controller of kControllers that `dir`'s subtree_control lacks.
Status EnableForChildren(const std::string& dir) {
  const std::string path = dir + "/cgroup.subtree_control";
  const std::optional<std::string> now = ReadSmallFile(path);
  std::string missing;
  for (const char* c : kControllers) {
    if (!now || !ListsController(*now, c))
      missing += (missing.empty() ? "+" : " +") + std::string(c);
  }
  if (missing.empty()) return Status::OK();
  Status s = WriteCgroupFile(path, missing);
  if (!s.ok() && s.message().find("busy") != std::string::npos) {
    return FailedPreconditionError(s.message() +
                                   " (a cgroup that holds processes cannot enable controllers for "
                                   "children: the kernel's no-internal-processes rule)");
  }
  return s;
}

std::string g_process_parent;  // removed at exit (when empty)

void RemoveProcessParent() {
  if (!g_process_parent.empty()) rmdir(g_process_parent.c_str());
}

}  // namespace

std::optional<std::string> CgroupV2Path(std::string_view proc_self_cgroup) {
  for (std::string_view line : Lines(proc_self_cgroup)) {
    if (line.substr(0, 3) == "0::") return std::string(line.substr(3));
  }
  return std::nullopt;
}

std::optional<std::string> CgroupV2Dir(std::string_view mountinfo, const std::string& path) {
  std::optional<std::string> best;
  size_t best_root = 0;
  for (std::string_view line : Lines(mountinfo)) {
    const std::vector<std::string_view> f = Fields(line);
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash < 5 || dash + 1 >= f.size() || f[dash + 1] != "cgroup2") continue;
    const std::string root = Unescape(f[3]), mount_point = Unescape(f[4]);
    std::string rest;
    if (root == "/") {
      rest = path == "/" ? "" : path;
    } else if (path == root) {
      rest = "";
    } else if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
               path[root.size()] == '/') {
      rest = path.substr(root.size());
    } else {
      continue;
    }
    if (!best || root.size() > best_root) {
      best = mount_point + rest;
      best_root = root.size();
    }
  }
  return best;
}

bool ListsController(std::string_view controllers, std::string_view controller) {
  for (std::string_view line : Lines(controllers)) {
    for (std::string_view f : Fields(line)) {
      if (f == controller) return true;
    }
  }
  return false;
}

int64_t EventCount(std::string_view events, std::string_view key) {
  for (std::string_view line : Lines(events)) {
    const std::vector<std::string_view> f = Fields(line);
    if (f.size() == 2 && f[0] == key) return std::strtoll(std::string(f[1]).c_str(), nullptr, 10);
  }
  return 0;
}

std::string CpuMaxValue(double cores) {
  if (cores <= 0) return "max";
  const int64_t quota = std::max<int64_t>(1000, std::llround(cores * 100000));
  return std::to_string(quota) + " 100000";
}

StatusOr<std::string> PrepareCgroupParent(const std::string& dir) {
  const std::optional<std::string> controllers = ReadSmallFile(dir + "/cgroup.controllers");
  if (!controllers) {
    return FailedPreconditionError(dir + ": no cgroup.controllers (not a cgroup v2 directory)");
  }
  std::string lacking;
  for (const char* c : kControllers) {
    if (!ListsController(*controllers, c))
      lacking += (lacking.empty() ? "" : ", ") + std::string(c);
  }
  if (!lacking.empty()) {
    return FailedPreconditionError(dir + "/cgroup.controllers lists no " + lacking +
                                   " (the controllers are not delegated there)");
  }
  ORRERY_RETURN_IF_ERROR(EnableForChildren(dir));
  const std::string mine = dir + "/orrery-" + std::to_string(getpid());
  if (mkdir(mine.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoError("cgroup: mkdir " + mine, errno);
  }
  Status s = EnableForChildren(mine);
  if (!s.ok()) {
    rmdir(mine.c_str());
    return s;
  }
  return mine;
}

StatusOr<std::optional<std::string>> SandboxCgroupParent(const std::string& setting) {
  static std::mutex mu;
  static std::map<std::string, StatusOr<std::optional<std::string>>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(setting);
  if (it != cache.end()) return it->second;
  StatusOr<std::optional<std::string>> result = std::optional<std::string>();
  if (setting == "off") {
    // nothing
  } else if (setting != "auto") {
    StatusOr<std::string> p = PrepareCgroupParent(setting);
    if (p.ok()) {
      result = std::optional<std::string>(*p);
    } else {
      result = p.status().WithContext("sandbox cgroup");
    }
  } else if (const char* env = std::getenv("ORRERY_SANDBOX_CGROUP"); env != nullptr && *env) {
    if (std::string(env) != "off") {
      StatusOr<std::string> p = PrepareCgroupParent(env);
      if (p.ok()) {
        result = std::optional<std::string>(*p);
      } else {
        result = p.status().WithContext("ORRERY_SANDBOX_CGROUP");
      }
    }
  } else {
    std::string why;
    const std::optional<std::string> self = ReadSmallFile("/proc/self/cgroup");
    const std::optional<std::string> path = self ? CgroupV2Path(*self) : std::nullopt;
    const std::optional<std::string> mountinfo = ReadSmallFile("/proc/self/mountinfo");
    const std::optional<std::string> dir =
        path && mountinfo ? CgroupV2Dir(*mountinfo, *path) : std::nullopt;
    if (!path) {
      why = "no cgroup v2 line in /proc/self/cgroup";
    } else if (!dir) {
      why = "no cgroup2 mount holds " + *path;
    } else {
      StatusOr<std::string> p = PrepareCgroupParent(*dir);
      if (p.ok()) {
        result = std::optional<std::string>(*p);
      } else {
        why = p.status().message();
      }
    }
    if (!why.empty()) {
      ORRERY_LOG(INFO) << "sandbox: no delegated cgroup v2 subtree (" << why
                       << "); caps are rlimits, tmpfs sizes and the resource watchdog "
                          "(docs/env.md; ORRERY_SANDBOX_CGROUP names a delegated one)";
    }
  }
  if (result.ok() && result->has_value() && g_process_parent.empty()) {
    g_process_parent = **result;
    std::atexit(RemoveProcessParent);
  }
  cache.emplace(setting, result);
  return result;
}

StatusOr<std::unique_ptr<SandboxCgroup>> SandboxCgroup::Create(const std::string& parent,
                                                               const CgroupCaps& caps) {
  static std::atomic<uint64_t> next{0};
  const std::string dir = parent + "/run-" + std::to_string(next++);
  if (mkdir(dir.c_str(), 0755) != 0) return ErrnoError("cgroup: mkdir " + dir, errno);
  const auto fail = [&](Status s) {
    rmdir(dir.c_str());
    return s;
  };
  if (caps.memory_bytes > 0) {
    Status s = WriteCgroupFile(dir + "/memory.max", std::to_string(caps.memory_bytes));
    if (!s.ok()) return fail(s);
    // Without swap accounting the file is absent; the cap then holds for resident memory only.
    if (access((dir + "/memory.swap.max").c_str(), F_OK) == 0) {
      s = WriteCgroupFile(dir + "/memory.swap.max", "0");
      if (!s.ok()) return fail(s);
    }
  }
  if (caps.pids > 0) {
    Status s = WriteCgroupFile(dir + "/pids.max", std::to_string(caps.pids));
    if (!s.ok()) return fail(s);
  }
  if (caps.cpu_cores > 0) {
    Status s = WriteCgroupFile(dir + "/cpu.max", CpuMaxValue(caps.cpu_cores));
    if (!s.ok()) return fail(s);
  }
  const int fd = open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return fail(ErrnoError("cgroup: open " + dir + "/cgroup.procs", errno));
  return std::unique_ptr<SandboxCgroup>(new SandboxCgroup(dir, fd));
}

SandboxCgroup::~SandboxCgroup() {
  close(procs_fd_);
  // Whatever is left (nothing, normally: the tree ended with bwrap) dies now; removal waits for
  // the processes to be gone.
  if (access((dir_ + "/cgroup.kill").c_str(), F_OK) == 0) {
    (void)WriteCgroupFile(dir_ + "/cgroup.kill", "1");
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (rmdir(dir_.c_str()) != 0 && errno == EBUSY && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

CgroupOutcome SandboxCgroup::Outcome() const {
  CgroupOutcome o;
  if (std::optional<std::string> m = ReadSmallFile(dir_ + "/memory.events")) {
    o.oom_killed = EventCount(*m, "oom_kill") > 0;
  }
  if (std::optional<std::string> p = ReadSmallFile(dir_ + "/pids.events")) {
    o.forks_refused = EventCount(*p, "max");
  }
  return o;
}

}  // namespace orrery::env
