#include "actors/replay/bench.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "actors/replay/client.h"
#include "actors/replay/server.h"
#include "actors/replay/store.h"
#include "core/philox.h"

namespace orrery::replay {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// Incompressible bytes, so compression flatters neither side.
std::string RandomBytes(int64_t n, uint64_t seed) {
  PhiloxGenerator rng(seed, 1);
  std::string s(static_cast<size_t>(n), '\0');
  for (char& c : s) c = static_cast<char>(rng.NextU32());
  return s;
}

struct RawResult {
  double put_per_s = 0, put_mb_s = 0, get_per_s = 0;
};

// The raw baselines' database: the store's options (LZ4, 64 MB write buffer).
StatusOr<std::unique_ptr<rocksdb::DB>> OpenRawDb(const std::string& dir) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.compression = rocksdb::kLZ4Compression;
  o.write_buffer_size = 64 << 20;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, dir, &raw);
  if (!s.ok()) return IoError("bench: " + s.ToString());
  return std::unique_ptr<rocksdb::DB>(raw);
}

StatusOr<RawResult> RawRocks(const std::string& dir, const std::vector<std::string>& values,
                             bool group_commit) {
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<rocksdb::DB> db, OpenRawDb(dir));
  rocksdb::Status s;
  rocksdb::WriteOptions wo;
  wo.sync = !group_commit;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < values.size(); ++i) {
    char key[32];
    std::snprintf(key, sizeof(key), "k%012zu", i);
    s = db->Put(wo, key, values[i]);
    if (!s.ok()) return IoError("bench: " + s.ToString());
  }
  if (group_commit) (void)db->SyncWAL();
  const auto t1 = Clock::now();
  std::string value;
  PhiloxGenerator rng(3, 0);
  const size_t gets = values.size();
  for (size_t i = 0; i < gets; ++i) {
    char key[32];
    std::snprintf(key, sizeof(key), "k%012zu", static_cast<size_t>(rng.UniformInt(values.size())));
    s = db->Get(rocksdb::ReadOptions(), key, &value);
    if (!s.ok()) return IoError("bench: " + s.ToString());
  }
  const auto t2 = Clock::now();
  RawResult r;
  const double bytes = static_cast<double>(values.size() * values[0].size());
  r.put_per_s = static_cast<double>(values.size()) / Seconds(t0, t1);
  r.put_mb_s = bytes / Seconds(t0, t1) / 1e6;
  r.get_per_s = static_cast<double>(gets) / Seconds(t1, t2);
  (void)db->Close();
  return r;
}

// The raw limit under the actor's own contract: `threads` writers, every Put durable on return
// (WAL fsync; concurrent synced writers share fsyncs through RocksDB's write groups), so it is
// compared like for like with the actor, whose insert is acknowledged only after its fsync.
StatusOr<double> RawRocksSyncedMbPerS(const std::string& dir,
                                      const std::vector<std::string>& values, int threads) {
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<rocksdb::DB> db, OpenRawDb(dir));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  std::atomic<int> failures{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> writers;
  for (int w = 0; w < threads; ++w) {
    writers.emplace_back([&, w] {
      for (size_t i = static_cast<size_t>(w); i < values.size();
           i += static_cast<size_t>(threads)) {
        char key[32];
        std::snprintf(key, sizeof(key), "k%012zu", i);
        if (!db->Put(wo, key, values[i]).ok()) ++failures;
      }
    });
  }
  for (auto& th : writers) th.join();
  const auto t1 = Clock::now();
  (void)db->Close();
  if (failures > 0) return InternalError("bench: raw synced Put failed");
  return static_cast<double>(values.size() * values[0].size()) / Seconds(t0, t1) / 1e6;
}

struct ActorResult {
  double insert_per_s = 0, insert_mb_s = 0, insert_p50_ms = 0, insert_p99_ms = 0;
  double sample_per_s = 0, sample_p50_ms = 0, sample_p99_ms = 0;
};

StatusOr<ActorResult> ThroughActor(const std::string& dir, const std::vector<std::string>& values,
                                   int clients, bool group_commit) {
  ReplayConfig config;
  config.storage.path = dir;
  config.storage.sync_each_write = !group_commit;
  config.storage.group_commit_ms = 1;
  config.checkpoint_root = dir + "-ckpt";
  TableOptions t;
  t.name = "bench";
  t.limiter = *MinSizeLimiter(1);
  t.max_size = static_cast<int64_t>(values.size()) + 1;
  t.max_item_bytes = 64ll << 20;
  config.tables.push_back(t);
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<ReplayStore> store, ReplayStore::Open(config));
  zmq::context_t context(1);
  ReplayServer server(store.get(), context);
  ORRERY_RETURN_IF_ERROR(server.Bind("tcp://127.0.0.1:*"));
  std::atomic<bool> stop{false};
  std::thread loop([&] { (void)server.Run([&] { return stop.load(); }); });
  const std::string endpoint = server.endpoint();

  std::vector<std::vector<double>> insert_ms(clients), sample_ms(clients);
  std::atomic<int> failures{0};
  auto run_phase = [&](bool inserting) {
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        auto client = ReplayClient::Connect(endpoint, &context);
        if (!client.ok()) {
          ++failures;
          return;
        }
        for (size_t i = static_cast<size_t>(c); i < values.size();
             i += static_cast<size_t>(clients)) {
          const auto a = Clock::now();
          bool ok;
          if (inserting) {
            ItemInput in;
            in.tokens = 1;
            in.trajectories = {values[i]};
            ok = (*client)->Insert("bench", in, 10000).ok();
          } else {
            ok = (*client)->Sample("bench", {1, -1, -1}, 10000).ok();
          }
          if (!ok) ++failures;
          (inserting ? insert_ms : sample_ms)[c].push_back(Seconds(a, Clock::now()) * 1e3);
        }
      });
    }
    for (auto& th : threads) th.join();
  };
  const auto t0 = Clock::now();
  run_phase(true);
  const auto t1 = Clock::now();
  run_phase(false);
  const auto t2 = Clock::now();
  stop = true;
  loop.join();
  if (failures > 0)
    return InternalError("bench: " + std::to_string(failures.load()) + " calls failed");
  std::vector<double> all_insert, all_sample;
  for (auto& v : insert_ms) all_insert.insert(all_insert.end(), v.begin(), v.end());
  for (auto& v : sample_ms) all_sample.insert(all_sample.end(), v.begin(), v.end());
  ActorResult r;
  const double n = static_cast<double>(values.size());
  r.insert_per_s = n / Seconds(t0, t1);
  r.insert_mb_s = n * static_cast<double>(values[0].size()) / Seconds(t0, t1) / 1e6;
  r.insert_p50_ms = Percentile(all_insert, 0.5);
  r.insert_p99_ms = Percentile(all_insert, 0.99);
  r.sample_per_s = n / Seconds(t1, t2);
  r.sample_p50_ms = Percentile(all_sample, 0.5);
  r.sample_p99_ms = Percentile(all_sample, 0.99);
  return r;
}

}  // namespace

Status RunReplayBench(const ReplayBenchOptions& options) {
  std::error_code ec;
  std::filesystem::remove_all(options.dir, ec);
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return IoError("bench: cannot create " + options.dir + ": " + ec.message());
  std::printf("sync: %s\n\n", options.group_commit ? "group commit (1 ms)" : "fsync per insert");
  std::printf(
      "| item | items | raw put/s | raw MB/s | raw get/s | clients | actor insert/s | actor MB/s "
      "| insert p50/p99 ms | samples/s | sample p50/p99 ms | actor/raw MB/s "
      "| raw synced MB/s | actor/raw synced |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int run = 0;
  for (int64_t size : options.sizes) {
    const int64_t items =
        std::max<int64_t>(16, std::min<int64_t>(options.max_items, options.bytes_per_run / size));
    std::vector<std::string> values;
    for (int64_t i = 0; i < items; ++i)
      values.push_back(RandomBytes(size, static_cast<uint64_t>(i)));
    ORRERY_ASSIGN_OR_RETURN(RawResult raw, RawRocks(options.dir + "/raw" + std::to_string(run++),
                                                    values, options.group_commit));
    for (int clients : options.clients) {
      ORRERY_ASSIGN_OR_RETURN(
          double synced_mb_s,
          RawRocksSyncedMbPerS(options.dir + "/raw" + std::to_string(run++), values, clients));
      ORRERY_ASSIGN_OR_RETURN(ActorResult a,
                              ThroughActor(options.dir + "/actor" + std::to_string(run++), values,
                                           clients, options.group_commit));
      std::printf(
          "| %lld KB | %lld | %.0f | %.1f | %.0f | %d | %.0f | %.1f | %.2f / %.2f | %.0f | %.2f / "
          "%.2f | %.2f | %.1f | %.2f |\n",
          static_cast<long long>(size / 1024), static_cast<long long>(items), raw.put_per_s,
          raw.put_mb_s, raw.get_per_s, clients, a.insert_per_s, a.insert_mb_s, a.insert_p50_ms,
          a.insert_p99_ms, a.sample_per_s, a.sample_p50_ms, a.sample_p99_ms,
          a.insert_mb_s / raw.put_mb_s, synced_mb_s, a.insert_mb_s / synced_mb_s);
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(options.dir, ec);
  return Status::OK();
}

}  // namespace orrery::replay
