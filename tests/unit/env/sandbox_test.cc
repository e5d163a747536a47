// Escape and containment tests for the bubblewrap sandbox. Each runs real bwrap: what must stay
// contained is checked from the outside (exit status, output, the host file system, processes).
#include "env/sandbox/sandbox.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "env/sandbox/sandbox_pool.h"
#include "env/sandbox/seccomp_filter.h"

namespace orrery::env {
namespace {

SandboxOptions SmallLimits() {
  SandboxOptions o;
  o.limits.wall_seconds = 5;
  o.limits.cpu_seconds = 2;
  o.limits.address_space_bytes = 512ll << 20;
  o.limits.file_size_bytes = 1 << 20;
  o.limits.processes = 16;
  o.limits.output_bytes = 4096;
  return o;
}

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // CTest runs each test in its own process, several at once: a slot (host uid) per process
    // keeps one test's fork bomb from eating another's RLIMIT_NPROC.
    StatusOr<std::unique_ptr<Sandbox>> s =
        Sandbox::Create(SmallLimits(), 3500 + static_cast<uint32_t>(getpid()) % 500);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    sandbox_ = std::move(*s);
  }
  RunResult Py(const std::string& code) {
    StatusOr<RunResult> r = sandbox_->Run({"/usr/bin/python3", "-c", code}, "", DeadlineIn(30));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : RunResult{};
  }
  std::unique_ptr<Sandbox> sandbox_;
};

TEST_F(SandboxTest, RunsPythonAsUnprivilegedUserWithoutCapabilities) {
  RunResult r =
      Py("import os\n"
         "print(os.getuid(), os.getgid())\n"
         "print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1])\n"
         "print(os.getcwd())");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(r.stdout_text, "65534 65534\n0000000000000000\n/work\n");
}

TEST_F(SandboxTest, StdinIsPassedAndWorkDirIsPrivateAndWritable) {
  ASSERT_TRUE(sandbox_->WriteFile("in.txt", "hello").ok());
  StatusOr<RunResult> r = sandbox_->Run(
      {"/usr/bin/python3", "-c",
       "import sys; d = sys.stdin.read(); open('out.txt', 'w').write(open('in.txt').read() + d)"},
      " world", DeadlineIn(30));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->stderr_text;
  std::ifstream f(sandbox_->work_dir() + "/out.txt");
  std::string content((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(content, "hello world");
  EXPECT_FALSE(sandbox_->WriteFile("../escape.txt", "x").ok());
  EXPECT_FALSE(sandbox_->WriteFile("/etc/escape.txt", "x").ok());
}

TEST_F(SandboxTest, HostFilesOutsideTheBindsAreInvisible) {
  const char* source = std::getenv("ORRERY_SOURCE_DIR");
  const std::string src = source ? source : "/work/main";
  RunResult r =
      Py("import os\n"
         "for p in ['/etc/passwd', '/etc/shadow', '/root', '/home', '" +
         src +
         "', '/proc/1/root/etc/passwd']:\n"
         "    print(p, os.path.exists(p))\n");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(r.stdout_text.find("True"), std::string::npos) << r.stdout_text;
}

TEST_F(SandboxTest, WritingToUsrFailsEvenAfterARemountAttempt) {
  RunResult r =
      Py("import ctypes, os\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "print(libc.mount(b'none', b'/usr', None, 0x20 | 0x1000, None),"
         " ctypes.get_errno())\n"  // MS_REMOUNT | MS_BIND
         "open('/usr/orrery-escape', 'w')\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.stdout_text, "-1 1\n");  // EPERM
  EXPECT_NE(r.stderr_text.find("Read-only file system"), std::string::npos) << r.stderr_text;
  EXPECT_FALSE(std::filesystem::exists("/usr/orrery-escape"));
}

TEST_F(SandboxTest, NoNetworkBeyondLoopback) {
  RunResult r =
      Py("import socket\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
         "c = socket.create_connection(s.getsockname(), timeout=2); print('loopback ok')\n"
         "try:\n"
         "    socket.create_connection(('1.1.1.1', 53), timeout=2); print('escaped')\n"
         "except OSError as e:\n"
         "    print('outside blocked')\n");
  EXPECT_EQ(r.stdout_text, "loopback ok\noutside blocked\n") << r.stderr_text;
}

TEST_F(SandboxTest, SeccompDeniesPtraceKeyctlBpfUnshare) {
  RunResult r =
      Py("import ctypes\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "out = []\n"
         "for nr in [101, 250, 321, 272]:\n"  // ptrace, keyctl, bpf, unshare (x86-64)
         "    out.append((libc.syscall(nr, 0, 0, 0, 0), ctypes.get_errno()))\n"
         "print(out)\n");
  EXPECT_EQ(r.stdout_text, "[(-1, 1), (-1, 1), (-1, 1), (-1, 1)]\n") << r.stderr_text;
  EXPECT_GT(DeniedSyscalls().size(), 30u);
}

TEST_F(SandboxTest, InfiniteLoopIsKilledByTheCpuLimit) {
  const auto start = std::chrono::steady_clock::now();
  RunResult r = Py("while True: pass");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Killed by the 2 s CPU limit, or by the 5 s wall limit when a loaded machine gives the loop
  // less than 2 s of CPU in 5 s of wall time: contained either way, and promptly.
  EXPECT_NE(r.signal, 0) << r.Describe();
  EXPECT_LT(took, 7.0);
}

TEST_F(SandboxTest, WallClockTimeoutKillsTheWholeTree) {
  // A sleeping child never uses CPU: only the wall-clock limit stops it.
  StatusOr<RunResult> r = sandbox_->Run(
      {"/usr/bin/python3", "-c",
       "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(600)\ntime.sleep(600)"},
      "", DeadlineIn(1.5));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out);
  EXPECT_LT(r->wall_seconds, 3.0);
}

bool UidHasProcesses(uid_t uid) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    struct stat st;
    if (stat(e.path().c_str(), &st) == 0 && st.st_uid == uid &&
        std::isdigit(e.path().filename().string()[0])) {
      return true;
    }
  }
  return false;
}

TEST_F(SandboxTest, ForkBombIsContainedAndCleanedUp) {
  StatusOr<RunResult> r =
      sandbox_->Run({"/usr/bin/python3", "-c",
                     "import os\nn = 0\nwhile True:\n    try:\n        os.fork(); n += 1\n"
                     "    except OSError:\n        pass\n"},
                    "", DeadlineIn(2));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out || r->signal != 0) << r->Describe();
  if (geteuid() == 0) {
    // Every process of the sandbox's host uid is gone once Run returns.
    struct stat st;
    ASSERT_EQ(stat(sandbox_->work_dir().c_str(), &st), 0);
    // Killing thousands of processes takes the kernel a moment on a loaded machine: wait <= 10 s.
    for (int i = 0; i < 500 && UidHasProcesses(st.st_uid); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_FALSE(UidHasProcesses(st.st_uid));
  }
}

TEST_F(SandboxTest, MemoryHogFailsInsideTheSandbox) {
  RunResult r = Py("b = bytearray(2 << 30)");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_text.find("MemoryError"), std::string::npos) << r.stderr_text;
}

TEST_F(SandboxTest, FileSizeLimit) {
  RunResult r = Py("open('big', 'wb').write(b'x' * (4 << 20))");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_text.find("File too large"), std::string::npos) << r.stderr_text;
}

TEST_F(SandboxTest, SignallingTheParentFails) {
  const int me = getpid();
  RunResult r =
      Py("import os, signal\n"
         "for pid in [" +
         std::to_string(me) + ", " + std::to_string(getppid()) +
         "]:\n"
         "    try:\n        os.kill(pid, signal.SIGKILL); print('sent')\n"
         "    except OSError as e:\n        print(type(e).__name__)\n"
         "os.kill(-1, signal.SIGKILL)\n");
  EXPECT_EQ(r.stdout_text.find("sent"), std::string::npos) << r.stdout_text;
  EXPECT_EQ(kill(me, 0), 0);  // still here
}

TEST_F(SandboxTest, OutputIsCapped) {
  RunResult r = Py("print('x' * 1000000)");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(r.output_truncated);
  EXPECT_EQ(r.stdout_text.size(), 4096u);
}

TEST_F(SandboxTest, LongRunningProcessSpeaksLines) {
  StatusOr<std::unique_ptr<SandboxProcess>> p =
      sandbox_->Start({"/usr/bin/python3", "-u", "-c",
                       "import sys\nfor line in sys.stdin:\n    print(line.strip().upper())"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE((*p)->WriteLine("ping", DeadlineIn(5)).ok());
  StatusOr<std::string> line = (*p)->ReadLine(DeadlineIn(10));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_EQ(*line, "PING");
  StatusOr<std::string> none = (*p)->ReadLine(DeadlineIn(0.2));
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(SandboxPoolTest, ReusedSandboxesStartClean) {
  SandboxPool pool(SmallLimits(), 1, 4100);
  std::string dir;
  {
    StatusOr<std::unique_ptr<PooledSandbox>> a = pool.Acquire(DeadlineIn(5));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    dir = (**a)->work_dir();
    ASSERT_TRUE((**a)->WriteFile("secret.txt", "from episode 1").ok());
    // The pool has one sandbox: a second Acquire waits and times out.
    EXPECT_EQ(pool.Acquire(DeadlineIn(0.1)).status().code(), StatusCode::kDeadlineExceeded);
  }
  StatusOr<std::unique_ptr<PooledSandbox>> b = pool.Acquire(DeadlineIn(5));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((**b)->work_dir(), dir);
  EXPECT_FALSE(std::filesystem::exists(dir + "/secret.txt"));
}

}  // namespace
}  // namespace orrery::env
