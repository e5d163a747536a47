#include "actors/replay/commands.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "actors/replay/bench.h"
#include "actors/replay/client.h"
#include "actors/replay/memory_retention.h"
#include "actors/replay/replay_config.h"
#include "actors/replay/server.h"
#include "actors/replay/store.h"
#include "actors/replay/wire.h"
#include "actors/runtime/fleet_curve.h"
#include "actors/runtime/role.h"
#include "core/logging.h"

namespace orrery::replay {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

std::string FormatDiff(double v) {
  if (v <= -1e300) return "-inf";
  if (v >= 1e300) return "+inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

int Serve(const CliArgs& args, const ConfigSections* sections) {
  StatusOr<ReplayConfig> config = LoadReplayConfig(args.Get("config"), sections);
  if (!config.ok()) return ReportError(config.status());
  if (args.Has("bind")) config->bind = args.Get("bind");
  if (args.Has("restore-from")) config->storage.restore_from = args.Get("restore-from");
  if (Status s = UseStandaloneServerKeys(config->bind, args.Get("curve-key-dir"),
                                         args.Flag("insecure-plain-tcp"));
      !s.ok()) {
    return ReportError(s.WithContext("replay serve"));
  }
  RetainFreedMemory(config->storage.write_buffer_bytes);
  StatusOr<std::unique_ptr<ReplayStore>> store = ReplayStore::Open(*config);
  if (!store.ok()) return ReportError(store.status());
  zmq::context_t context(1);
  ReplayServer server(store->get(), context);
  Status s = server.Bind(config->bind);
  if (!s.ok()) return ReportError(s);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::printf("replay: serving %zu tables on %s (database %s)\n", config->tables.size(),
              server.endpoint().c_str(), config->storage.path.c_str());
  std::fflush(stdout);
  s = server.Run([] { return g_stop != 0; });
  if (!s.ok()) return ReportError(s);
  ORRERY_LOG(INFO) << "replay: stopped";
  return 0;
}

// --curve-key-dir: the fleet's keys, to reach a fleet's store on tcp.
Status UseKeysOf(const CliArgs& args) {
  const std::string dir = args.Get("curve-key-dir");
  return dir.empty() ? Status::OK() : UseFleetCurveKeyDir(dir);
}

int Info(const CliArgs& args) {
  if (Status s = UseKeysOf(args); !s.ok()) return ReportError(s);
  StatusOr<std::unique_ptr<ReplayClient>> client =
      ReplayClient::Connect(args.Get("connect"), nullptr, {args.Int("timeout-ms", 5000)});
  if (!client.ok()) return ReportError(client.status());
  StatusOr<std::vector<TableInfo>> info = (*client)->Info();
  if (!info.ok()) return ReportError(info.status());
  for (const TableInfo& t : *info) {
    const TableOptions& o = t.options;
    std::printf(
        "%s: size %lld/%lld, %lld bytes, inserts %lld, samples %lld, deletes %lld (%s), "
        "stale evicted %lld, learner version %lld, batches logged %lld\n"
        "  sampler %s, remover %s, max_times_sampled %d, max_staleness %lld\n"
        "  rate limiter: samples_per_insert %g, min_size_to_sample %lld, diff [%s, %s]\n"
        "  blocked: inserts %lld (p50 %.3f ms, p99 %.3f ms), samples %lld (p50 %.3f ms, "
        "p99 %.3f ms)\n",
        o.name.c_str(), static_cast<long long>(t.size), static_cast<long long>(o.max_size),
        static_cast<long long>(t.bytes), static_cast<long long>(t.counters.inserts),
        static_cast<long long>(t.counters.samples), static_cast<long long>(t.counters.deletes),
        std::string(CountUnitName(o.count_unit)).c_str(), static_cast<long long>(t.stale_evicted),
        static_cast<long long>(t.learner_version), static_cast<long long>(t.batches_logged),
        std::string(SelectorKindName(o.sampler.kind)).c_str(),
        std::string(SelectorKindName(o.remover.kind)).c_str(), o.max_times_sampled,
        static_cast<long long>(o.max_staleness), o.limiter.samples_per_insert,
        static_cast<long long>(o.limiter.min_size_to_sample),
        FormatDiff(o.limiter.min_diff).c_str(), FormatDiff(o.limiter.max_diff).c_str(),
        static_cast<long long>(t.insert_blocked.blocked_calls), t.insert_blocked.p50_ms,
        t.insert_blocked.p99_ms, static_cast<long long>(t.sample_blocked.blocked_calls),
        t.sample_blocked.p50_ms, t.sample_blocked.p99_ms);
  }
  return 0;
}

int CheckpointCommand(const CliArgs& args) {
  if (Status s = UseKeysOf(args); !s.ok()) return ReportError(s);
  StatusOr<std::unique_ptr<ReplayClient>> client =
      ReplayClient::Connect(args.Get("connect"), nullptr, {args.Int("timeout-ms", 5000)});
  if (!client.ok()) return ReportError(client.status());
  StatusOr<std::string> out = (*client)->Checkpoint(args.Get("dir"));
  if (!out.ok()) return ReportError(out.status());
  std::printf("%s\n", out->c_str());
  return 0;
}

int Soak(const CliArgs& args) {
  ReplaySoakOptions o;
  o.dir = args.Get("dir");
  o.group_commit = args.Get("sync") != "per_insert";
  o.clients = static_cast<int>(args.Int("clients"));
  o.seconds = static_cast<int>(args.Int("seconds"));
  o.warmup_s = static_cast<int>(args.Int("warmup-s"));
  o.item_bytes = args.Int("item-kb") << 10;
  o.block_cache_bytes = args.Int("block-cache-mb") << 20;
  o.write_buffer_bytes = args.Int("write-buffer-mb") << 20;
  o.table_bytes = o.block_cache_bytes * args.Int("table-over-cache");
  Status s = RunReplaySoak(o);
  return s.ok() ? 0 : ReportError(s);
}

int Bench(const CliArgs& args) {
  if (args.Flag("soak")) return Soak(args);
  ReplayBenchOptions o;
  o.dir = args.Get("dir");
  o.group_commit = args.Get("sync") != "per_insert";
  o.bytes_per_run = args.Int("mb-per-size") << 20;
  o.max_items = args.Int("max-items");
  if (o.bytes_per_run < 1 || o.max_items < 1) {
    return ReportError(
        InvalidArgumentError("replay bench: --mb-per-size and --max-items must be >= 1"));
  }
  if (args.Get("sync") != "per_insert" && args.Get("sync") != "group") {
    return ReportError(InvalidArgumentError(
        "replay bench: --sync must be per_insert or group, got '" + args.Get("sync") + "'"));
  }
  {
    o.sizes.clear();
    std::stringstream list(args.Get("sizes-kb"));
    for (std::string field; std::getline(list, field, ',');) {
      char* end = nullptr;
      const long long kb = std::strtoll(field.c_str(), &end, 10);
      if (field.empty() || *end != '\0' || kb < 1 || kb > (1 << 20)) {
        return ReportError(InvalidArgumentError(
            "replay bench: --sizes-kb must be a comma list of sizes in [1, 1048576] KiB, got '" +
            args.Get("sizes-kb") + "'"));
      }
      o.sizes.push_back(kb * 1024);
    }
  }
  Status s = RunReplayBench(o);
  return s.ok() ? 0 : ReportError(s);
}

// The "replay" actor role: the store as one actor of a fleet. Its database lives in the
// instance's state directory unless [replay].path says otherwise.
Status ReplayMain(ActorContext& ctx) {
  ConfigTable root = ctx.config_root();
  const bool has_path = root.Table("replay").Has("path");
  ReplayConfig config = ReadReplayConfig(root);
  if (!has_path) config.storage.path = ctx.state_dir() + "/db";
  for (const TableOptions& t : config.tables) ORRERY_RETURN_IF_ERROR(ValidateTableOptions(t));
  RetainFreedMemory(config.storage.write_buffer_bytes);
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<ReplayStore> store, ReplayStore::Open(config));
  ReplayServer server(store.get(), ctx.zmq());
  ORRERY_RETURN_IF_ERROR(server.Bind(ctx.endpoint()));
  ctx.SetReady();
  // Asked once per loop iteration (at most 50 ms apart unless a request handler blocks).
  return server.Run([&ctx] {
    ctx.Progress();
    return ctx.stop().cancelled();
  });
}

}  // namespace

void RegisterReplayCommands(CliRegistry& registry) {
  registry.config_sections().Add("replay", [](ConfigTable& root) { ReadReplayConfig(root); });
  // Keys read only for some tables: a prioritized sampler, each form of the ratio limiter.
  registry.config_sections().AddKeyExample(
      "[[replay.tables]]\nname = \"t\"\nsampler = \"prioritized\"\n[replay.tables.rate_limiter]\n"
      "kind = \"sample_to_insert_ratio\"\nerror_buffer = 1.0\n");
  registry.config_sections().AddKeyExample(
      "[[replay.tables]]\nname = \"t\"\n[replay.tables.rate_limiter]\n"
      "kind = \"sample_to_insert_ratio\"\n");
  RegisterActorRole({"replay", "the durable RocksDB replay store", ReplayMain});

  registry.AddGroup({"replay"}, "The durable replay store: serve it, inspect it, checkpoint it");
  const ConfigSections* sections = &registry.config_sections();
  registry.Add(CliCommand{
      {"replay", "serve"},
      "Serve the replay store of a config over ZeroMQ until SIGINT/SIGTERM",
      {{"--config", "TOML file with a [replay] section and [[replay.tables]]", CliKind::kString,
        true, ""},
       {"--bind", "endpoint to listen on (overrides replay.bind)", CliKind::kString, false, ""},
       {"--restore-from", "checkpoint directory to start from when the database is empty",
        CliKind::kString, false, ""},
       {"--curve-key-dir", "CURVE keys: clients must hold the same (needed beyond loopback)",
        CliKind::kString, false, ""},
       {"--insecure-plain-tcp", "serve plain tcp beyond loopback without keys", CliKind::kFlag,
        false, ""}},
      [sections](const CliArgs& args) { return Serve(args, sections); }});
  registry.Add(CliCommand{
      {"replay", "info"},
      "Print every table of a running replay store: size, counters, limiter, blocked time",
      {{"--connect", "the store's endpoint (tcp://host:port)", CliKind::kString, true, ""},
       {"--timeout-ms", "give up when the store does not answer", CliKind::kInt, false, "5000"},
       {"--curve-key-dir", "the fleet's CURVE keys (a fleet's store on tcp)", CliKind::kString,
        false, ""}},
      Info});
  registry.Add(CliCommand{
      {"replay", "checkpoint"},
      "Write a RocksDB checkpoint of a running replay store (blocks no insert or sample)",
      {{"--connect", "the store's endpoint (tcp://host:port)", CliKind::kString, true, ""},
       {"--dir",
        "name of the directory to create under the store's replay.checkpoint_dir (default: a new "
        "timestamped one); absolute paths and '..' are refused",
        CliKind::kString, false, ""},
       {"--timeout-ms", "give up when the store does not answer", CliKind::kInt, false, "5000"},
       {"--curve-key-dir", "the fleet's CURVE keys (a fleet's store on tcp)", CliKind::kString,
        false, ""}},
      CheckpointCommand});
  registry.Add(CliCommand{
      {"replay", "bench"},
      "Benchmark the replay actor over loopback (1 and 8 clients) against raw RocksDB Put/Get, or "
      "soak it (--soak)",
      {{"--dir", "scratch directory (deleted before and after)", CliKind::kString, false,
        "/tmp/orrery_replay_bench"},
       {"--sync", "per_insert or group (applies to both raw RocksDB and the store)",
        CliKind::kString, false, "group"},
       {"--mb-per-size", "bytes written per item size, in MiB", CliKind::kInt, false, "256"},
       {"--max-items", "at most this many items per size", CliKind::kInt, false, "4000"},
       {"--sizes-kb", "item sizes to run, in KiB, comma separated", CliKind::kString, false,
        "4,64,1024"},
       {"--soak",
        "instead: a soak of --clients inserting and sampling for --seconds against "
        "a store process (throughput, p50/p99, the store's RSS over time)",
        CliKind::kFlag, false, ""},
       {"--clients", "soak: client threads", CliKind::kInt, false, "64"},
       {"--seconds", "soak: timed duration after the fill", CliKind::kInt, false, "60"},
       {"--warmup-s", "soak: first seconds of the timed run left out of the RSS range",
        CliKind::kInt, false, "10"},
       {"--item-kb", "soak: item size in KiB", CliKind::kInt, false, "16"},
       {"--block-cache-mb", "soak: the store's RocksDB block cache", CliKind::kInt, false, "16"},
       {"--write-buffer-mb", "soak: the store's memtable size (at most two are held)",
        CliKind::kInt, false, "8"},
       {"--table-over-cache", "soak: payload bytes the table holds, as a multiple of the cache",
        CliKind::kInt, false, "10"}},
      Bench});
}

}  // namespace orrery::replay
