// The NCCL communicator on two GPUs: two ranks as forked processes on devices 0 and 1, meeting
// through a unique-id file. All-reduce (f32, f64) is checked against the sum computed on the host
// from both ranks' inputs, broadcast against the root's bytes; a peer that exits early makes the
// other rank's collective fail within the timeout instead of hanging. Skipped without 2 GPUs.
//
// CUDA must not be initialized in the test process before it forks the ranks, so even the device
// count is probed in a child process.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <vector>

#include "core/philox.h"
#include "learner/comm/nccl_communicator.h"

namespace orrery::comm {
namespace {

using Clock = std::chrono::steady_clock;

int WaitExitCode(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int VisibleDevices() {
  static const int devices = [] {
    pid_t pid = fork();
    if (pid == 0) {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
      _exit(std::min(n, 100));
    }
    return WaitExitCode(pid);
  }();
  return devices;
}

#define SKIP_WITHOUT_TWO_GPUS() \
  if (VisibleDevices() < 2)     \
  GTEST_SKIP() << "needs 2 CUDA devices, " << VisibleDevices() << " visible"

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             (name + "-" + std::to_string(getpid()) + "-" +
              std::to_string(Clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Runs body(rank) in `world` forked processes; returns each child's exit code (0 = passed).
std::vector<int> RunRanks(int world, const std::function<int(int)>& body) {
  // No NVLink multicast (NVLS): the test needs none, and on shared GPU hosts a program using it
  // can take the GPUs out of service.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(120);  // a hung collective kills the child instead of the test run
      _exit(body(r));
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) codes.push_back(WaitExitCode(pid));
  return codes;
}

NcclOptions Options(int rank, const std::string& dir, const std::string& generation,
                    int64_t timeout_ms) {
  NcclOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.device = rank;
  o.store_dir = dir;
  o.generation = generation;
  o.timeout_ms = timeout_ms;
  return o;
}

// Rank r's inputs: Philox normals on stream r, scaled so that the f64 sums cover a wide range.
std::vector<float> InputF32(int rank, size_t n) {
  PhiloxGenerator g(17, static_cast<uint64_t>(rank));
  std::vector<float> x(n);
  for (float& v : x) v = g.Normal();
  return x;
}
std::vector<double> InputF64(int rank, size_t n) {
  PhiloxGenerator g(29, static_cast<uint64_t>(rank));
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(g.Normal()) * (i % 2 ? 1e300 : 1e-3);
  return x;
}

// The all-reduce of one size on both ranks, compared with the host's sum. With two ranks each
// element is one addition a + b (commutative), so NCCL's result must equal the host's exactly.
int CheckAllReduce(Communicator& comm, size_t n, int code) {
  std::vector<float> f = InputF32(comm.rank(), n);
  const std::vector<float> f0 = InputF32(0, n), f1 = InputF32(1, n);
  if (!comm.AllReduceSum(std::span<float>(f)).ok()) return code;
  for (size_t i = 0; i < n; ++i) {
    if (f[i] != f0[i] + f1[i]) return code + 1;
  }
  std::vector<double> d = InputF64(comm.rank(), n);
  const std::vector<double> d0 = InputF64(0, n), d1 = InputF64(1, n);
  if (!comm.AllReduceSum(std::span<double>(d)).ok()) return code + 2;
  for (size_t i = 0; i < n; ++i) {
    if (d[i] != d0[i] + d1[i]) return code + 3;
  }
  return 0;
}

TEST(NcclGpu, TwoRanksAllReduceBroadcastBarrier) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string dir = TempDir("orrery-nccl");
  auto codes = RunRanks(2, [&](int rank) -> int {
    {
      auto comm = CreateNcclCommunicator(Options(rank, dir, "1", 60000));
      if (!comm.ok()) {
        fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
        return 10;
      }
      Communicator& c = **comm;
      if (c.rank() != rank || c.world_size() != 2 || c.backend() != "nccl") return 11;
      // Small, large (the buffers grow), then small again (they are reused); an odd size.
      for (size_t n : {size_t{1}, size_t{1000003}, size_t{4099}}) {
        if (int e = CheckAllReduce(c, n, 20); e != 0) return e;
      }
      // Gradient averaging across two tensors (one flattened all-reduce).
      Tensor a = Tensor::FromVector<float>({2}, {static_cast<float>(rank), 2.0f});
      Tensor b = Tensor::FromVector<float>({1}, {static_cast<float>(10 * rank)});
      if (!AllReduceMean(c, {a, b}).ok()) return 30;
      if (a.data<float>()[0] != 0.5f || a.data<float>()[1] != 2.0f || b.data<float>()[0] != 5.0f)
        return 31;
      // Broadcast from each root: every rank ends with the root's bytes.
      for (int root : {1, 0}) {
        std::vector<uint8_t> bytes(3 << 20);
        for (size_t i = 0; i < bytes.size(); ++i) {
          bytes[i] = static_cast<uint8_t>(rank == root ? (i * 131 + root) : 0xEE);
        }
        if (!c.Broadcast(std::span<uint8_t>(bytes), root).ok()) return 40;
        for (size_t i = 0; i < bytes.size(); ++i) {
          if (bytes[i] != static_cast<uint8_t>(i * 131 + root)) return 41;
        }
      }
      if (!c.Barrier().ok()) return 50;
      std::vector<uint8_t> one(1);
      if (c.Broadcast(std::span<uint8_t>(one), 2).code() != StatusCode::kInvalidArgument) return 51;
      // Empty spans are no-ops on every rank.
      if (!c.AllReduceSum(std::span<float>()).ok()) return 52;
    }
    // A restarted group (next generation) joins again after the first was finalized.
    auto again = CreateNcclCommunicator(Options(rank, dir, "2", 60000));
    if (!again.ok() || !(*again)->Barrier().ok()) return 60;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::filesystem::remove_all(dir);
}

TEST(NcclGpu, PeerExitFailsTheCollectiveWithinTheTimeout) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string dir = TempDir("orrery-nccl-dead");
  constexpr int64_t kTimeoutMs = 3000;
  auto codes = RunRanks(2, [&](int rank) -> int {
    auto comm = CreateNcclCommunicator(Options(rank, dir, "7", kTimeoutMs));
    if (!comm.ok()) return 10;
    if (!(*comm)->Barrier().ok()) return 11;
    if (rank == 1) _exit(0);  // dies without taking part in the next collective
    std::vector<float> f(1 << 16, 1.0f);
    const auto start = Clock::now();
    Status s = (*comm)->AllReduceSum(std::span<float>(f));
    const auto waited = Clock::now() - start;
    fprintf(stderr, "rank 0 after the peer exited: %s (%.0f ms)\n", s.ToString().c_str(),
            std::chrono::duration<double, std::milli>(waited).count());
    if (s.ok()) return 30;
    if (s.message().find("rank 0") == std::string::npos) return 31;
    // The timeout bounds the wait; the slack covers polling and NCCL's abort.
    if (waited > std::chrono::milliseconds(kTimeoutMs + 5000)) return 32;
    // Later collectives fail at once with the same error.
    const auto later = Clock::now();
    Status again = (*comm)->Barrier();
    if (again.ok() || again.message() != s.message()) return 33;
    if (Clock::now() - later > std::chrono::milliseconds(100)) return 34;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::filesystem::remove_all(dir);
}

TEST(NcclGpu, MissingPeerTimesOutAtRendezvous) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string dir = TempDir("orrery-nccl-alone");
  // Rank 0 alone: publishes the id, then its init waits for a peer that never comes.
  // Rank 1 alone (another generation): the id file never appears.
  auto codes = RunRanks(2, [&](int rank) -> int {
    const auto start = Clock::now();
    auto comm = CreateNcclCommunicator(Options(rank, dir, rank == 0 ? "a" : "b", 1000));
    const auto waited = Clock::now() - start;
    if (comm.ok()) return 10;
    fprintf(stderr, "rank %d alone: %s\n", rank, comm.status().ToString().c_str());
    if (comm.status().code() != StatusCode::kDeadlineExceeded) return 11;
    if (comm.status().message().find("could not join") == std::string::npos && rank == 0) return 12;
    if (comm.status().message().find("nccl-unique-id-b") == std::string::npos && rank == 1)
      return 13;
    if (waited > std::chrono::milliseconds(1000 + 5000)) return 14;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orrery::comm
