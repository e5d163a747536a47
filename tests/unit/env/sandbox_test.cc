// Escape and containment tests for the bubblewrap sandbox. Each runs real bwrap: what must stay
// contained is checked from the outside (exit status, output, the host file system, processes).
#include "env/sandbox/sandbox.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
    // CTest runs each test in its own process, several at once: each process claims its own
    // host uid range, so one test's fork bomb cannot eat another's RLIMIT_NPROC.
    StatusOr<std::unique_ptr<Sandbox>> s = Sandbox::Create(SmallLimits(), 0);
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

// Where the host's pid 1 does not reap (many container inits do not), a killed sandbox must leave
// no orphan behind: an orphaned namespace init stays a zombie of the sandbox's uid, and ~35 of
// them spent RLIMIT_NPROC so that no sandbox of that uid could start (CI, before bwrap_tree.h).
// This process stands in for such a pid 1: as a child subreaper it inherits every orphan below
// it, and it never reaps one.
TEST(SandboxReapTest, KilledTreesLeaveNoOrphansForInitToReap) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
  SandboxOptions o = SmallLimits();
  o.limits.processes = 4;  // RLIMIT_NPROC of 7: orphans would spend it within the loop below
  o.limits.memory_bytes = 128 << 20;
  std::unique_ptr<Sandbox> s = std::move(*Sandbox::Create(o, 5));
  for (int i = 0; i < 8; ++i) {
    // The wall clock ends these (KillBwrapTree from Run).
    StatusOr<RunResult> r =
        s->Run({"/usr/bin/python3", "-c", "import time; time.sleep(600)"}, "", DeadlineIn(0.3));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->timed_out) << i << ": " << r->Describe() << r->stderr_text;
  }
  // RLIMIT_CPU ends this one (SIGKILL from the kernel)...
  StatusOr<RunResult> cpu =
      s->Run({"/usr/bin/python3", "-c", "while True: pass"}, "", DeadlineIn(60));
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->signal, SIGKILL) << cpu->Describe() << cpu->stderr_text;
  // ...and the watchdog this one (resident memory over the cap).
  StatusOr<RunResult> memory =
      s->Run({"/usr/bin/python3", "-c", "import time; b = b'x' * (300 << 20); time.sleep(60)"}, "",
             DeadlineIn(60));
  ASSERT_TRUE(memory.ok());
  EXPECT_FALSE(memory->limit_exceeded.empty()) << memory->Describe() << memory->stderr_text;
  // A long-running process ended by its owner (SandboxProcess::Kill).
  StatusOr<std::unique_ptr<SandboxProcess>> p =
      s->Start({"/usr/bin/python3", "-c", "import time; time.sleep(600)"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  p->reset();
  // Still able to start: nothing of this uid is left.
  StatusOr<RunResult> ok = s->Run({"/usr/bin/python3", "-c", "print('ok')"}, "", DeadlineIn(30));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->stdout_text, "ok\n") << ok->Describe() << ok->stderr_text;
  // Every child of this process was a bwrap it reaped; an orphan would show up here.
  int orphans = 0;
  for (int tries = 0; tries < 100; ++tries) {
    siginfo_t info{};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0) break;  // ECHILD: none
    if (info.si_pid != 0) {
      ++orphans;
      waitpid(info.si_pid, nullptr, 0);
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a live one, maybe dying
  }
  EXPECT_EQ(orphans, 0) << "orphaned sandbox processes were left for the host's init to reap";
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << "a child of this process is still alive";
}

// The attacks of issue 27 on the kernel surface (x86-64 system call numbers): a process inside
// made a user namespace (uid 0 with all capabilities in it) and a network namespace with clone,
// set up an io_uring, and bound an AF_VSOCK socket in the host's vsock port space.
TEST_F(SandboxTest, NoNewNamespacesIoUringOrVsock) {
  RunResult r = Py(
      "import ctypes, errno, os, socket\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "def call(nr, *args):\n"
      "    ctypes.set_errno(0)\n"
      "    r = libc.syscall(nr, *args)\n"
      "    if r == 0 and nr == 56:\n"
      "        os._exit(0)  # a clone child\n"
      "    return errno.errorcode.get(ctypes.get_errno(), 'ok') if r < 0 else 'ok'\n"
      "SIGCHLD = 17\n"
      "for flag in (0x10000000, 0x40000000, 0x20000000, 0x00020000):  # USER NET PID NS\n"
      "    print('clone', hex(flag), call(56, flag | SIGCHLD, 0, 0, 0, 0))\n"
      "args = (ctypes.c_uint64 * 11)(0x10000000)  # struct clone_args, flags = CLONE_NEWUSER\n"
      "print('clone3', call(435, ctypes.byref(args), 88))\n"
      "params = ctypes.create_string_buffer(120)\n"
      "print('io_uring_setup', call(425, 8, params))\n"
      "for family in (40, 16, 17, 0):  # AF_VSOCK, AF_NETLINK, AF_PACKET, AF_UNSPEC\n"
      "    try:\n"
      "        socket.socket(family, socket.SOCK_DGRAM if family != 40 else socket.SOCK_STREAM)\n"
      "        print('socket', family, 'ok')\n"
      "    except OSError as e:\n"
      "        print('socket', family, errno.errorcode[e.errno])\n"
      "for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):\n"
      "    socket.socket(family, socket.SOCK_STREAM).close()\n"
      "a, b = socket.socketpair(); print('socketpair ok')\n"
      "pid = os.fork()\n"
      "if pid == 0:\n"
      "    os._exit(0)\n"
      "print('fork', os.waitpid(pid, 0)[1])\n");
  EXPECT_EQ(r.stdout_text,
            "clone 0x10000000 EPERM\nclone 0x40000000 EPERM\nclone 0x20000000 EPERM\n"
            "clone 0x20000 EPERM\nclone3 ENOSYS\nio_uring_setup EPERM\n"
            "socket 40 EAFNOSUPPORT\nsocket 16 EAFNOSUPPORT\nsocket 17 EAFNOSUPPORT\n"
            "socket 0 EAFNOSUPPORT\nsocketpair ok\nfork 0\n")
      << r.stderr_text;
  // Threads (glibc's pthread_create tries clone3, then clone) and subprocesses still work.
  r =
      Py("import subprocess, threading\n"
         "t = threading.Thread(target=lambda: print('thread ok')); t.start(); t.join()\n"
         "print(subprocess.run(['/usr/bin/echo', 'child ok'], capture_output=True, text=True)"
         ".stdout, end='')\n");
  EXPECT_EQ(r.stdout_text, "thread ok\nchild ok\n") << r.stderr_text;
}

// Writes `n` files of 1 MiB (the per-file limit) into `dir`: "ENOSPC after K" or "wrote n".
std::string FillDirectory(const std::string& dir, int n) {
  return "import errno\n"
         "for i in range(" +
         std::to_string(n) +
         "):\n"
         "    try:\n"
         "        with open('" +
         dir +
         "/f%d' % i, 'wb') as f:\n"
         "            f.write(b'x' * ((1 << 20) - 1))\n"
         "    except OSError as e:\n"
         "        print(errno.errorcode[e.errno], 'after', i); break\n"
         "else:\n"
         "    print('wrote', " +
         std::to_string(n) + ")\n";
}

// "2 GiB into /tmp" of issue 27, scaled down: 64 MiB against a tmpfs of 8 MiB.
TEST(SandboxCapsTest, TmpIsASizeLimitedTmpfs) {
  SandboxOptions o = SmallLimits();
  o.limits.tmp_bytes = 8 << 20;
  std::unique_ptr<Sandbox> s = std::move(*Sandbox::Create(o, 1));
  StatusOr<RunResult> r =
      s->Run({"/usr/bin/python3", "-c", FillDirectory("/tmp", 64)}, "", DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout_text.rfind("ENOSPC after ", 0), 0u) << r->stdout_text << r->stderr_text;
}

// "2 GiB into /work", scaled down: /work is a tmpfs of work_bytes when Orrery may mount (root).
TEST(SandboxCapsTest, WorkIsASizeLimitedTmpfsWhenOrreryMayMount) {
  SandboxOptions o = SmallLimits();
  o.limits.work_bytes = 8 << 20;
  std::unique_ptr<Sandbox> s = std::move(*Sandbox::Create(o, 2));
  if (geteuid() != 0) GTEST_SKIP() << "not root: /work is not a tmpfs (docs/env.md)";
  EXPECT_TRUE(s->work_dir_capped());
  StatusOr<RunResult> r =
      s->Run({"/usr/bin/python3", "-c", FillDirectory("/work", 64)}, "", DeadlineIn(30));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stdout_text.rfind("ENOSPC after ", 0), 0u) << r->stdout_text << r->stderr_text;
  // Files Orrery writes and the next run see the same capped directory; Reset empties it.
  ASSERT_TRUE(s->Reset().ok());
  ASSERT_TRUE(s->WriteFile("a.txt", "hello").ok());
  r = s->Run({"/usr/bin/cat", "a.txt"}, "", DeadlineIn(30));
  EXPECT_EQ(r->stdout_text, "hello");
}

// "4 x 600 MiB resident", scaled down: 4 processes of 100 MiB each, every one within its own
// address-space limit (512 MiB), against 256 MiB for all processes together.
TEST(SandboxCapsTest, MemoryOfAllProcessesTogetherIsCapped) {
  SandboxOptions o = SmallLimits();
  o.limits.memory_bytes = 256 << 20;
  o.limits.wall_seconds = 30;
  std::unique_ptr<Sandbox> s = std::move(*Sandbox::Create(o, 3));
  StatusOr<RunResult> r = s->Run({"/usr/bin/python3", "-c",
                                  "import os, time\n"
                                  "pids = []\n"
                                  "for i in range(4):\n"
                                  "    pid = os.fork()\n"
                                  "    if pid == 0:\n"
                                  "        b = b'x' * (100 << 20)\n"
                                  "        time.sleep(3)\n"
                                  "        os._exit(0)\n"
                                  "    pids.append(pid)\n"
                                  "print('all exited', [os.waitpid(p, 0)[1] for p in pids])\n"},
                                 "", DeadlineIn(60));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Describe(), "killed: memory limit: 256 MiB for all processes together")
      << r->stdout_text << r->stderr_text;
  EXPECT_EQ(r->stdout_text, "");
  // One process of 100 MiB is within the limit.
  r = s->Run({"/usr/bin/python3", "-c", "b = b'x' * (100 << 20); print('ok')"}, "", DeadlineIn(60));
  EXPECT_EQ(r->stdout_text, "ok\n") << r->Describe() << r->stderr_text;
}

// CPU time of all processes together: four busy loops, each under its own RLIMIT_CPU of 2 s.
TEST(SandboxCapsTest, CpuTimeOfAllProcessesTogetherIsCapped) {
  SandboxOptions o = SmallLimits();
  o.limits.wall_seconds = 60;  // a loaded machine gives the four loops little CPU per second
  std::unique_ptr<Sandbox> s = std::move(*Sandbox::Create(o, 4));
  StatusOr<RunResult> r = s->Run({"/usr/bin/python3", "-c",
                                  "import os\n"
                                  "pids = [os.fork() for _ in range(2)]\n"  // 4 processes
                                  "while True:\n"
                                  "    pass\n"},
                                 "", DeadlineIn(90));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Describe(), "killed: CPU time limit: 2 s for all processes together");
}

// Two Orrery processes never share host uids: each claims its own range (root only).
TEST(SandboxCapsTest, EachProcessHasItsOwnHostUidRange) {
  if (geteuid() != 0) GTEST_SKIP() << "not root: bwrap runs as Orrery's own uid";
  // Fork before this process starts any thread (the watchdog starts with the first run).
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);  // so that the parent's close is an end of file here
    StatusOr<std::unique_ptr<Sandbox>> s = Sandbox::Create(SmallLimits(), 0);
    const uint32_t uid = s.ok() ? (*s)->host_uid() : 0;
    if (write(to_parent[1], &uid, sizeof uid) != sizeof uid) _exit(1);
    char c;
    (void)!read(to_child[0], &c, 1);  // holds its range until the parent is done
    _exit(0);
  }
  close(to_parent[1]);
  close(to_child[0]);
  uint32_t child_uid = 0;
  ASSERT_EQ(read(to_parent[0], &child_uid, sizeof child_uid),
            static_cast<ssize_t>(sizeof child_uid));
  StatusOr<std::unique_ptr<Sandbox>> mine = Sandbox::Create(SmallLimits(), 0);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  close(to_child[1]);
  waitpid(child, nullptr, 0);
  EXPECT_NE(child_uid, 0u);
  EXPECT_NE((*mine)->host_uid(), child_uid);
  EXPECT_EQ((*mine)->host_uid() % 4096, child_uid % 4096);  // same slot, different range
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
