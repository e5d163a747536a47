#include "actors/replay/bench.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "actors/replay/client.h"
#include "actors/replay/memory_retention.h"
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

// The resident memory of process `pid` in bytes (VmRSS), 0 when unreadable.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) << 10;
  }
  return 0;
}

volatile std::sig_atomic_t soak_store_stop = 0;

// The soak's store process: serves until SIGTERM; writes its endpoint (or "error: ...") to `fd`.
[[noreturn]] void SoakStoreMain(const ReplaySoakOptions& o, int fd) {
  std::signal(SIGTERM, [](int) { soak_store_stop = 1; });
  auto report = [fd](const std::string& line) {
    const std::string text = line + "\n";
    (void)!write(fd, text.data(), text.size());
    close(fd);
  };
  ReplayConfig config;
  config.storage.path = o.dir + "/db";
  config.storage.sync_each_write = !o.group_commit;
  config.storage.group_commit_ms = 1;
  config.storage.block_cache_bytes = o.block_cache_bytes;
  config.storage.write_buffer_bytes = o.write_buffer_bytes;
  config.checkpoint_root = o.dir + "/checkpoints";
  TableOptions t;
  t.name = "soak";
  t.limiter = *MinSizeLimiter(1);
  t.max_size = std::max<int64_t>(1, o.table_bytes / o.item_bytes);
  t.max_item_bytes = o.item_bytes;
  config.tables.push_back(t);
  RetainFreedMemory(o.write_buffer_bytes);  // as `replay serve` does
  StatusOr<std::unique_ptr<ReplayStore>> store = ReplayStore::Open(config);
  if (!store.ok()) {
    report("error: " + store.status().ToString());
    _exit(1);
  }
  {
    zmq::context_t context(1);
    ReplayServer server(store->get(), context);
    if (Status s = server.Bind("tcp://127.0.0.1:*"); !s.ok()) {
      report("error: " + s.ToString());
      _exit(1);
    }
    report(server.endpoint());
    (void)server.Run([] { return soak_store_stop != 0; });
  }
  store->reset();
  _exit(0);
}

// One soak client's latencies (ms) and failures.
struct SoakClientResult {
  std::vector<double> insert_ms, sample_ms;
  int64_t failures = 0;
  std::string first_error;
};

}  // namespace

Status RunReplaySoak(const ReplaySoakOptions& o) {
  if (o.clients < 1 || o.seconds < 1 || o.item_bytes < 1 || o.table_bytes < o.item_bytes ||
      o.block_cache_bytes < 1 || o.write_buffer_bytes < 1 || o.report_every_s < 1 ||
      o.warmup_s < 0 || o.warmup_s >= o.seconds) {
    return InvalidArgumentError(
        "replay bench --soak: clients, seconds, item size, block cache and write buffer must be "
        ">= 1, the warm-up shorter than the run and the table must hold at least one item");
  }
  std::error_code ec;
  std::filesystem::remove_all(o.dir, ec);
  std::filesystem::create_directories(o.dir, ec);
  if (ec) return IoError("bench: cannot create " + o.dir + ": " + ec.message());
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return IoError("bench: pipe failed");
  // Forked before this process starts any thread.
  const pid_t child = fork();
  if (child < 0) return IoError("bench: fork failed");
  if (child == 0) {
    close(pipe_fds[0]);
    SoakStoreMain(o, pipe_fds[1]);
  }
  close(pipe_fds[1]);
  std::string endpoint;
  {
    char buf[512];
    ssize_t n;
    while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) endpoint.append(buf, n);
    close(pipe_fds[0]);
    while (!endpoint.empty() && endpoint.back() == '\n') endpoint.pop_back();
  }
  auto stop_store = [child] {
    kill(child, SIGTERM);
    int status = 0;
    waitpid(child, &status, 0);
    return status;
  };
  if (endpoint.rfind("tcp://", 0) != 0) {
    stop_store();
    return InternalError("bench: the store process did not start: " + endpoint);
  }

  const int64_t max_size = std::max<int64_t>(1, o.table_bytes / o.item_bytes);
  std::vector<std::string> payloads;
  for (int i = 0; i < 64; ++i) payloads.push_back(RandomBytes(o.item_bytes, 1000 + i));
  zmq::context_t context(2);
  std::atomic<int64_t> inserts{0}, samples{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> timing{false};
  std::vector<SoakClientResult> results(o.clients);
  auto client_loop = [&](int c, bool fill_only) {
    SoakClientResult& r = results[c];
    auto client = ReplayClient::Connect(endpoint, &context);
    if (!client.ok()) {
      ++r.failures;
      r.first_error = client.status().ToString();
      return;
    }
    uint64_t n = static_cast<uint64_t>(c);
    while (!stop.load()) {
      ItemInput in;
      in.group_id = n;
      in.tokens = 1;
      in.trajectories = {payloads[n % payloads.size()]};
      n += static_cast<uint64_t>(o.clients);
      auto a = Clock::now();
      Status s = (*client)->Insert("soak", in, 10000).status();
      const double insert_ms = Seconds(a, Clock::now()) * 1e3;
      if (!s.ok()) {
        if (r.first_error.empty()) r.first_error = s.ToString();
        ++r.failures;
        continue;
      }
      ++inserts;
      if (fill_only) continue;
      a = Clock::now();
      s = (*client)->Sample("soak", {1, -1, -1}, 10000).status();
      const double sample_ms = Seconds(a, Clock::now()) * 1e3;
      if (!s.ok()) {
        if (r.first_error.empty()) r.first_error = s.ToString();
        ++r.failures;
        continue;
      }
      ++samples;
      if (timing.load()) {
        r.insert_ms.push_back(insert_ms);
        r.sample_ms.push_back(sample_ms);
      }
    }
  };
  auto table_info = [&]() -> StatusOr<TableInfo> {
    ORRERY_ASSIGN_OR_RETURN(auto client, ReplayClient::Connect(endpoint, &context));
    ORRERY_ASSIGN_OR_RETURN(std::vector<TableInfo> tables, client->Info());
    if (tables.empty()) return InternalError("bench: the store has no table");
    return tables[0];
  };

  std::printf(
      "soak: %d clients (each: insert, then sample 1), %d s, %lld KiB items, table max_size "
      "%lld (%.0f MiB of payload), block cache %.0f MiB, write buffer %.0f MiB, %s\n\n",
      o.clients, o.seconds, static_cast<long long>(o.item_bytes >> 10),
      static_cast<long long>(max_size), static_cast<double>(max_size * o.item_bytes) / (1 << 20),
      static_cast<double>(o.block_cache_bytes) / (1 << 20),
      static_cast<double>(o.write_buffer_bytes) / (1 << 20),
      o.group_commit ? "group commit (1 ms)" : "fsync per insert");
  // Warm-up: fill the table to max_size.
  const auto fill_start = Clock::now();
  {
    std::vector<std::thread> fillers;
    for (int c = 0; c < std::min(o.clients, 8); ++c) fillers.emplace_back(client_loop, c, true);
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      StatusOr<TableInfo> info = table_info();
      if (!info.ok() || info->size >= max_size) break;
    }
    stop = true;
    for (auto& th : fillers) th.join();
    stop = false;
  }
  std::printf("warm-up: filled to %lld items in %.1f s; store RSS %.0f MiB\n\n",
              static_cast<long long>(max_size), Seconds(fill_start, Clock::now()),
              static_cast<double>(ResidentBytes(child)) / (1 << 20));
  std::printf(
      "| t (s) | inserts/s | samples/s | store RSS MiB | table MiB |\n|---|---|---|---|---|\n");
  for (SoakClientResult& r : results) r = SoakClientResult();
  inserts = 0;
  samples = 0;
  timing = true;
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) threads.emplace_back(client_loop, c, false);
  const auto t0 = Clock::now();
  int64_t last_inserts = 0, last_samples = 0;
  auto last = t0;
  int64_t rss_min = INT64_MAX, rss_max = 0;
  for (int s = 1; s <= o.seconds; ++s) {
    std::this_thread::sleep_until(t0 + std::chrono::seconds(s));
    const int64_t rss = ResidentBytes(child);
    if (s > o.warmup_s) {
      rss_min = std::min(rss_min, rss);
      rss_max = std::max(rss_max, rss);
    }
    if (s % o.report_every_s != 0 && s != o.seconds) continue;
    const auto now = Clock::now();
    const int64_t i = inserts.load(), n = samples.load();
    StatusOr<TableInfo> info = table_info();
    std::printf("| %d | %.0f | %.0f | %.0f | %.0f |\n", s,
                static_cast<double>(i - last_inserts) / Seconds(last, now),
                static_cast<double>(n - last_samples) / Seconds(last, now),
                static_cast<double>(rss) / (1 << 20),
                info.ok() ? static_cast<double>(info->bytes) / (1 << 20) : -1.0);
    std::fflush(stdout);
    last_inserts = i;
    last_samples = n;
    last = now;
  }
  stop = true;
  for (auto& th : threads) th.join();
  const double elapsed = Seconds(t0, Clock::now());
  const int status = stop_store();
  std::filesystem::remove_all(o.dir, ec);

  std::vector<double> insert_ms, sample_ms;
  int64_t failures = 0;
  std::string first_error;
  for (const SoakClientResult& r : results) {
    insert_ms.insert(insert_ms.end(), r.insert_ms.begin(), r.insert_ms.end());
    sample_ms.insert(sample_ms.end(), r.sample_ms.begin(), r.sample_ms.end());
    failures += r.failures;
    if (first_error.empty()) first_error = r.first_error;
  }
  std::printf(
      "\n| clients | inserts/s | MB/s in | samples/s | insert p50/p99 ms | sample p50/p99 ms | "
      "RSS after %d s min/max MiB | spread | failed calls |\n"
      "|---|---|---|---|---|---|---|---|---|\n"
      "| %d | %.0f | %.1f | %.0f | %.2f / %.2f | %.2f / %.2f | %.0f / %.0f | %.1f%% | %lld |\n",
      o.warmup_s, o.clients, static_cast<double>(insert_ms.size()) / elapsed,
      static_cast<double>(insert_ms.size()) * static_cast<double>(o.item_bytes) / elapsed / 1e6,
      static_cast<double>(sample_ms.size()) / elapsed, Percentile(insert_ms, 0.5),
      Percentile(insert_ms, 0.99), Percentile(sample_ms, 0.5), Percentile(sample_ms, 0.99),
      static_cast<double>(rss_min) / (1 << 20), static_cast<double>(rss_max) / (1 << 20),
      rss_min > 0 ? 100.0 * static_cast<double>(rss_max - rss_min) / static_cast<double>(rss_min)
                  : 0.0,
      static_cast<long long>(failures));
  if (failures > 0) std::printf("first failure: %s\n", first_error.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError("bench: the store process ended with status " + std::to_string(status));
  }
  return Status::OK();
}

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
