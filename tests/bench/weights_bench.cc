// Weight transfer to a rollout without a shared filesystem ([rl.rollout] weights = "learner"):
// WeightFetcher copying one published version from a WeightServer, by transport (ipc, tcp on
// loopback with the fleet's CURVE keys, as every tcp fleet socket has them) and chunk size. Each
// iteration fetches the whole file into a fresh directory (fsync and rename included); the file is
// fresh random weights. Both directories are under $ORRERY_BENCH_DIR (default /tmp): on a tmpfs
// (/dev/shm) the figure is the transport's, on a disk it includes writing and syncing the copy.
// Figures go to docs/benchmarks.md.
//
//   ORRERY_BENCH_DIR=/dev/shm build-cpu/tests/weights_bench --benchmark_min_time=3
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "actors/rl/weight_fetcher.h"
#include "actors/rl/weight_server.h"
#include "actors/runtime/actor.h"
#include "actors/runtime/fleet_curve.h"
#include "learner/rl/weight_store.h"

namespace orrery::rl_actors {
namespace {

std::string BenchDir(const std::string& name) {
  const char* root = std::getenv("ORRERY_BENCH_DIR");
  return std::string(root != nullptr && *root != '\0' ? root : "/tmp") + "/orrery_weights_bench_" +
         name + "_" + std::to_string(getpid());
}

// A learner directory holding version 1 of `bytes` random f32 weights, served at `endpoint`.
class Served {
 public:
  Served(const std::string& endpoint, int64_t bytes)
      : dir_(BenchDir("learner")), server_(dir_), actor_(zmq_, "learner:0") {
    std::filesystem::remove_all(dir_);
    Tensor t = Tensor::Empty({bytes / 4}, DType::kF32);
    std::mt19937 rng(1);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng());
    status_ = rl::WeightStore(dir_).Publish({{"w", t}}, 1).status();
    if (status_.ok()) status_ = actor_.Bind(endpoint);
    server_.Register(actor_);
    if (status_.ok()) thread_ = std::thread([this] { (void)actor_.Run(stop_); });
  }
  ~Served() {
    stop_.Cancel();
    if (thread_.joinable()) thread_.join();
    std::filesystem::remove_all(dir_);
  }
  const Status& status() const { return status_; }
  const std::string& endpoint() const { return actor_.endpoint(); }
  zmq::context_t& zmq() { return zmq_; }

 private:
  std::string dir_;
  zmq::context_t zmq_;
  WeightServer server_;
  Actor actor_;
  Status status_;
  Cancellation stop_;
  std::thread thread_;
};

// Args: transport (0 ipc, 1 tcp + CURVE), file MiB, chunk MiB.
void BM_FetchVersion(benchmark::State& state) {
  const bool tcp = state.range(0) == 1;
  const int64_t bytes = state.range(1) << 20;
  if (tcp) {
    StatusOr<CurveKeyPair> keys = GenerateCurveKeyPair();
    if (!keys.ok()) return state.SkipWithError(keys.status().message().c_str());
    SetFleetCurveKeys(*keys);
  }
  Served served(tcp ? "tcp://127.0.0.1:0"
                    : "ipc:///tmp/orrery_weights_bench_" + std::to_string(getpid()) + ".sock",
                bytes);
  if (!served.status().ok()) return state.SkipWithError(served.status().message().c_str());
  const std::string local = BenchDir("rollout");
  WeightFetchOptions o;
  o.dir = local;
  o.chunk_bytes = state.range(2) << 20;
  WeightFetcher fetcher(served.zmq(), "rollout:0", o);
  if (Status s = fetcher.Connect(served.endpoint()); !s.ok()) {
    return state.SkipWithError(s.message().c_str());
  }
  for (auto _ : state) {
    std::filesystem::remove_all(local);
    StatusOr<FetchStats> got = fetcher.FetchNewest(-1, nullptr);
    if (!got.ok() || got->version != 1) {
      return state.SkipWithError(got.ok() ? "nothing fetched" : got.status().message().c_str());
    }
  }
  std::filesystem::remove_all(local);
  SetFleetCurveKeys(std::nullopt);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(std::string(tcp ? "tcp+curve" : "ipc") + ", " + std::to_string(state.range(1)) +
                 " MiB file, " + std::to_string(state.range(2)) + " MiB chunks");
}
BENCHMARK(BM_FetchVersion)
    ->ArgsProduct({{0, 1}, {256}, {1, 2, 4, 8, 32}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace orrery::rl_actors

BENCHMARK_MAIN();
