#include "env/sandbox/cgroup.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "env/sandbox/sandbox.h"

namespace orrery::env {
namespace {

namespace fs = std::filesystem;

std::string Fixture(const std::string& name) {
  const char* source = std::getenv("ORRERY_SOURCE_DIR");
  std::ifstream in(std::string(source ? source : ".") + "/tests/fixtures/cgroup/" + name);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_FALSE(s.str().empty()) << name;
  return s.str();
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// A directory standing in for a cgroup (its interface files are plain files).
struct FakeCgroup {
  FakeCgroup() {
    std::string tmpl = (fs::temp_directory_path() / "orrery-cgroup-test-XXXXXX").string();
    dir = mkdtemp(tmpl.data());
  }
  ~FakeCgroup() { fs::remove_all(dir); }
  fs::path dir;
};

TEST(CgroupParseTest, ProcSelfCgroupAndMountinfo) {
  // This machine's kind: cgroup v1 controllers, an empty cgroup2 at /sys/fs/cgroup/unified.
  EXPECT_EQ(CgroupV2Path(Fixture("proc_self_cgroup_hybrid.txt")), "/");
  EXPECT_EQ(CgroupV2Dir(Fixture("mountinfo_hybrid.txt"), "/"), "/sys/fs/cgroup/unified");
  // A systemd machine with cgroup v2 only.
  const std::optional<std::string> path = CgroupV2Path(Fixture("proc_self_cgroup_v2.txt"));
  EXPECT_EQ(path, "/user.slice/user-1000.slice/user@1000.service/app.slice/orrery.service");
  EXPECT_EQ(CgroupV2Dir(Fixture("mountinfo_v2.txt"), *path), "/sys/fs/cgroup" + *path);
  // A mount of part of the hierarchy (its root is not "/"): the deepest root that holds the path
  // wins; mount points are unescaped.
  const std::string partial = Fixture("mountinfo_partial_root.txt");
  EXPECT_EQ(CgroupV2Dir(partial, "/kubepods/pod1/c1"), "/sys/fs/cgroup/c1");
  EXPECT_EQ(CgroupV2Dir(partial, "/kubepods/pod1"), "/sys/fs/cgroup");
  EXPECT_EQ(CgroupV2Dir(partial, "/kubepods/pod10"), "/mnt/cg all/kubepods/pod10");
  EXPECT_EQ(CgroupV2Dir(Fixture("mountinfo_v2.txt").substr(0, 140), "/x"), std::nullopt);
  EXPECT_EQ(CgroupV2Path("1:cpu:/\n2:memory:/x\n"), std::nullopt);  // cgroup v1 only
}

TEST(CgroupParseTest, ControllersEventsAndCpuMax) {
  EXPECT_TRUE(ListsController("cpuset cpu io memory hugetlb pids rdma\n", "cpu"));
  EXPECT_TRUE(ListsController("cpuset cpu io memory hugetlb pids rdma\n", "pids"));
  EXPECT_FALSE(ListsController("cpuset io memory\n", "cpu"));
  EXPECT_FALSE(ListsController("hugetlb\n", "memory"));
  const std::string memory_events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
  EXPECT_EQ(EventCount(memory_events, "oom_kill"), 1);
  EXPECT_EQ(EventCount(memory_events, "max"), 12);
  EXPECT_EQ(EventCount("max 0\n", "max"), 0);
  EXPECT_EQ(EventCount("", "oom_kill"), 0);
  EXPECT_EQ(CpuMaxValue(2), "200000 100000");
  EXPECT_EQ(CpuMaxValue(0.5), "50000 100000");
  EXPECT_EQ(CpuMaxValue(0.001), "1000 100000");  // the kernel's least quota is 1 ms
  EXPECT_EQ(CpuMaxValue(0), "max");
}

TEST(CgroupParseTest, PrepareParentChecksControllersAndEnablesThem) {
  FakeCgroup cg;
  StatusOr<std::string> p = PrepareCgroupParent(cg.dir.string());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("no cgroup.controllers (not a cgroup v2 directory)"),
            std::string::npos)
      << p.status().ToString();
  Write(cg.dir / "cgroup.controllers", "cpuset io memory hugetlb\n");
  p = PrepareCgroupParent(cg.dir.string());
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("cgroup.controllers lists no pids, cpu"), std::string::npos)
      << p.status().ToString();
  Write(cg.dir / "cgroup.controllers", "cpuset cpu io memory hugetlb pids\n");
  Write(cg.dir / "cgroup.subtree_control", "memory\n");
  p = PrepareCgroupParent(cg.dir.string());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, (cg.dir / ("orrery-" + std::to_string(getpid()))).string());
  // Only what was missing is enabled (the plain file now holds what was written).
  EXPECT_EQ(Read(cg.dir / "cgroup.subtree_control"), "+pids +cpu");
  EXPECT_EQ(Read(fs::path(*p) / "cgroup.subtree_control"), "+memory +pids +cpu");
}

TEST(CgroupParseTest, RunCgroupGetsTheCapsAndReportsWhichHit) {
  FakeCgroup cg;
  Write(cg.dir / "memory.swap.max", "max");
  StatusOr<std::unique_ptr<SandboxCgroup>> run =
      SandboxCgroup::Create(cg.dir.string(), CgroupCaps{256 << 20, 35, 1.5});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  const fs::path dir = (*run)->dir();
  EXPECT_EQ(dir.parent_path(), cg.dir);
  EXPECT_EQ(Read(dir / "memory.max"), "268435456");
  EXPECT_EQ(Read(dir / "pids.max"), "35");
  EXPECT_EQ(Read(dir / "cpu.max"), "150000 100000");
  EXPECT_FALSE(fs::exists(dir / "memory.swap.max"));  // only where the kernel has the file
  EXPECT_GE((*run)->procs_fd(), 0);
  EXPECT_FALSE((*run)->Outcome().oom_killed);
  Write(dir / "memory.events", "low 0\nhigh 0\nmax 40\noom 1\noom_kill 1\n");
  Write(dir / "pids.events", "max 4\n");
  EXPECT_TRUE((*run)->Outcome().oom_killed);
  EXPECT_EQ((*run)->Outcome().forks_refused, 4);
}

TEST(CgroupParseTest, AnExplicitCgroupThatIsNoneFailsTheSandbox) {
  FakeCgroup cg;
  SandboxOptions o;
  o.cgroup = cg.dir.string();
  StatusOr<std::unique_ptr<Sandbox>> s = Sandbox::Create(o, 11);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not a cgroup v2 directory"), std::string::npos)
      << s.status().ToString();
  o.cgroup = "off";
  s = Sandbox::Create(o, 11);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->cgroup_parent(), std::nullopt);
}

// The kernel side of a run's cgroup, wherever this process may create a cgroup v2 child (as root
// in the cgroup2 mount of a hybrid machine, which has no controllers): a process that writes "0"
// to procs_fd() is in the cgroup, and destroying it kills what is left and removes it.
TEST(SandboxCgroupTest, ProcessesMoveInAndTheCgroupIsKilledAndRemoved) {
  std::ifstream self("/proc/self/cgroup"), mounts("/proc/self/mountinfo");
  std::stringstream a, b;
  a << self.rdbuf();
  b << mounts.rdbuf();
  const std::optional<std::string> path = CgroupV2Path(a.str());
  const std::optional<std::string> own = path ? CgroupV2Dir(b.str(), *path) : std::nullopt;
  const std::string parent =
      own.value_or("/nonexistent") + "/orrery-test-" + std::to_string(getpid());
  if (!own || mkdir(parent.c_str(), 0755) != 0) {
    GTEST_SKIP() << "cannot create a cgroup v2 child of this process's cgroup";
  }
  StatusOr<std::unique_ptr<SandboxCgroup>> run = SandboxCgroup::Create(parent, CgroupCaps{});
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  const std::string dir = (*run)->dir();
  const pid_t child = fork();
  if (child == 0) {
    if (write((*run)->procs_fd(), "0", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  std::string in;
  for (int i = 0; i < 1000 && in.find(std::to_string(child)) == std::string::npos; ++i) {
    usleep(1000);
    in = Read(dir + "/cgroup.procs");
  }
  EXPECT_EQ(in, std::to_string(child) + "\n");
  EXPECT_NE(Read("/proc/" + std::to_string(child) + "/cgroup").find(dir.substr(own->size())),
            std::string::npos);
  run->reset();  // cgroup.kill, then rmdir once the child is gone (a zombie does not count)
  EXPECT_FALSE(fs::exists(dir));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(rmdir(parent.c_str()), 0);
}

// The kernel's caps, where this machine delegates a cgroup v2 subtree with memory, pids and cpu
// (or ORRERY_SANDBOX_CGROUP names one); elsewhere the rlimit/watchdog tests of sandbox_test.cc
// hold the caps.
TEST(SandboxCgroupTest, CapsHoldInTheKernelWhereACgroupIsDelegated) {
  StatusOr<std::optional<std::string>> parent = SandboxCgroupParent("auto");
  ASSERT_TRUE(parent.ok()) << parent.status().ToString();
  if (!parent->has_value()) {
    GTEST_SKIP() << "no delegated cgroup v2 subtree with memory, pids and cpu here (see the log "
                    "line; set ORRERY_SANDBOX_CGROUP to a delegated one to run this test)";
  }
  SandboxOptions o;
  o.limits.memory_bytes = 128 << 20;
  o.limits.address_space_bytes = 1ll << 30;
  o.limits.processes = 8;
  o.limits.cpu_cores = 0.5;
  o.limits.wall_seconds = 20;
  StatusOr<std::unique_ptr<Sandbox>> s = Sandbox::Create(o, 12);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ((*s)->cgroup_parent(), *parent);
  // Memory of all processes together: 4 x 60 MiB, each within RLIMIT_AS.
  StatusOr<RunResult> r = (*s)->Run(
      {"/usr/bin/python3", "-c",
       "import os, time\nfor _ in range(3):\n    if os.fork() == 0: break\n"
       "b = bytearray(60 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(5)\n"},
      "", DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Describe(),
            "killed: memory limit: 128 MiB for all processes together (cgroup memory.max)");
  // Processes: forks beyond pids.max fail, and the result says so.
  r = (*s)->Run({"/usr/bin/python3", "-c",
                 "import os, time\nn = 0\nfor _ in range(30):\n    try:\n"
                 "        if os.fork() == 0:\n            time.sleep(2)\n            os._exit(0)\n"
                 "        n += 1\n    except OSError:\n        pass\nprint(n)\n"},
                "", DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->forks_refused, 0) << r->Describe();
  EXPECT_LT(std::stoi(r->stdout_text), 30);
  // CPU bandwidth: half a core, so 1 s of wall clock spinning gets about 0.5 s of CPU time.
  r = (*s)->Run({"/usr/bin/python3", "-c",
                 "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1: pass\n"
                 "print(time.process_time())\n"},
                "", DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(std::stod(r->stdout_text), 0.75) << r->stdout_text;
  // Each run's cgroup is gone after it.
  int left = 0;
  for (const auto& e : fs::directory_iterator(**parent)) left += e.is_directory();
  EXPECT_EQ(left, 0);
}

}  // namespace
}  // namespace orrery::env
