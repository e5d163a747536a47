// Communicators: the single-rank identity, and Gloo with two ranks as two real processes meeting
// through a FileStore directory over TCP on 127.0.0.1.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <vector>

#include "learner/comm/communicator.h"
#include "learner/comm/gloo_communicator.h"
#include "tests/unit/forked_ranks.h"

namespace orrery::comm {
namespace {

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             (name + "-" + std::to_string(getpid()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(RlComm, LocalIsIdentity) {
  auto comm = MakeLocalCommunicator();
  std::vector<float> x = {1, 2};
  ASSERT_TRUE(comm->AllReduceSum(std::span<float>(x)).ok());
  EXPECT_EQ(x[1], 2);
  Tensor t = Tensor::FromVector<float>({2}, {3, 4});
  ASSERT_TRUE(AllReduceMean(*comm, {t}).ok());
  EXPECT_EQ(t.data<float>()[0], 3);
  EXPECT_FALSE(AllReduceMean(*comm, {Tensor::Zeros({2}, DType::kF64)}).ok());
}

TEST(RlComm, GlooTwoProcessesAllReduceBroadcastBarrier) {
  const std::string dir = TempDir("orrery-gloo");
  auto codes = RunForkedRanks(2, [&](int rank) -> int {
    GlooOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.store_dir = dir;
    o.timeout_ms = 20000;
    auto comm = CreateGlooCommunicator(o);
    if (!comm.ok()) return 10;
    if ((*comm)->rank() != rank || (*comm)->world_size() != 2) return 11;
    // Sums: rank r contributes (r + 1) * (i + 1).
    std::vector<float> f(1000);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>((rank + 1) * (i + 1));
    if (!(*comm)->AllReduceSum(std::span<float>(f)).ok()) return 12;
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] != static_cast<float>(3 * (i + 1))) return 13;
    }
    std::vector<double> d = {0.25 * rank, 1e300};
    if (!(*comm)->AllReduceSum(std::span<double>(d)).ok()) return 14;
    if (d[0] != 0.25 || d[1] != 2e300) return 15;
    // Gradient averaging across two tensors.
    Tensor a = Tensor::FromVector<float>({2}, {static_cast<float>(rank), 2.0f});
    Tensor b = Tensor::FromVector<float>({1}, {static_cast<float>(10 * rank)});
    if (!AllReduceMean(**comm, {a, b}).ok()) return 16;
    if (a.data<float>()[0] != 0.5f || a.data<float>()[1] != 2.0f || b.data<float>()[0] != 5.0f)
      return 17;
    std::vector<uint8_t> bytes(5, static_cast<uint8_t>(rank == 1 ? 42 : 0));
    if (!(*comm)->Broadcast(std::span<uint8_t>(bytes), 1).ok()) return 18;
    for (uint8_t x : bytes) {
      if (x != 42) return 19;
    }
    if (!(*comm)->Barrier().ok()) return 20;
    if ((*comm)->Broadcast(std::span<uint8_t>(bytes), 2).ok()) return 21;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::filesystem::remove_all(dir);
}

TEST(RlComm, GlooPeerDeathIsAnErrorNotAHang) {
  const std::string dir = TempDir("orrery-gloo-dead");
  auto codes = RunForkedRanks(2, [&](int rank) -> int {
    GlooOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.store_dir = dir;
    o.generation = "7";
    o.timeout_ms = 3000;
    auto comm = CreateGlooCommunicator(o);
    if (!comm.ok()) return 10;
    if (!(*comm)->Barrier().ok()) return 11;
    if (rank == 1) _exit(0);  // dies without taking part in the next collective
    std::vector<float> f(16, 1.0f);
    Status s = (*comm)->AllReduceSum(std::span<float>(f));
    if (s.ok()) return 30;
    // Later collectives fail at once with the same error.
    if ((*comm)->Barrier().ok()) return 31;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::filesystem::remove_all(dir);
}

void NoteSigpipe(int) {}

// A peer that dies mid-collective makes Gloo's next socket write raise SIGPIPE: the communicator
// must leave the process alive (SIG_IGN) so the write fails as a status, yet keep a handler the
// process installed itself.
TEST(RlComm, GlooIgnoresSigpipeButKeepsTheProcessHandler) {
  const std::string dir = TempDir("orrery-gloo-sigpipe");
  auto codes = RunForkedRanks(2, [&](int child) -> int {
    if (child == 1) signal(SIGPIPE, NoteSigpipe);
    GlooOptions o;
    o.store_dir = dir;
    o.generation = std::to_string(child);
    auto comm = CreateGlooCommunicator(o);
    if (!comm.ok()) return 10;
    struct sigaction now = {};
    if (sigaction(SIGPIPE, nullptr, &now) != 0) return 11;
    if (child == 0 && now.sa_handler != SIG_IGN) return 12;
    if (child == 1 && now.sa_handler != NoteSigpipe) return 13;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::filesystem::remove_all(dir);
}

TEST(RlComm, GlooMissingPeerTimesOutAtRendezvous) {
  const std::string dir = TempDir("orrery-gloo-alone");
  GlooOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.store_dir = dir;
  o.timeout_ms = 500;
  auto comm = CreateGlooCommunicator(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("could not join"), std::string::npos);
  o.rank = 2;
  EXPECT_FALSE(CreateGlooCommunicator(o).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orrery::comm
