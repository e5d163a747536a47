#include "actors/replay/replay_config.h"

#include <set>

namespace orrery::replay {
namespace {

const std::vector<std::string> kSelectorNames = {"uniform", "prioritized", "fifo",
                                                 "lifo",    "min_heap",    "max_heap"};

SelectorOptions ReadSelector(ConfigTable& t, const std::string& key, const std::string& def) {
  SelectorOptions s;
  s.kind = *ParseSelectorKind(t.Enum(key, def, kSelectorNames));
  return s;
}

RateLimiterOptions ReadLimiter(ConfigTable& t) {
  const std::string kind = t.Enum("kind", "min_size", {"min_size", "sample_to_insert_ratio"});
  const int64_t min_size = t.Int("min_size_to_sample", 1, 1);
  StatusOr<RateLimiterOptions> out = MinSizeLimiter(min_size);
  if (kind == "sample_to_insert_ratio") {
    const double spi = t.RequiredFloat("samples_per_insert", 1e-9);
    if (t.Has("error_buffer")) {
      const double e = t.Float("error_buffer", 0, 0);
      out = SampleToInsertRatioLimiter(spi, min_size, e);
    } else {
      const double lo = t.RequiredFloat("min_diff");
      const double hi = t.RequiredFloat("max_diff");
      out = SampleToInsertRatioLimiter(spi, min_size, lo, hi);
    }
  }
  if (!out.ok()) {
    t.Fail("kind", out.status().message());
    return RateLimiterOptions{};
  }
  return *out;
}

TableOptions ReadTable(ConfigTable& t) {
  TableOptions o;
  o.name = t.RequiredString("name");
  if (Status s = ValidateTableName(o.name); !s.ok() && t.Has("name")) t.Fail("name", s.message());
  const std::string preset = t.Enum("preset", "none", {"none", "queue", "stack"});
  if (preset == "none") {
    o.max_size = t.Int("max_size", 1 << 20, 1);
    o.sampler = ReadSelector(t, "sampler", "uniform");
    o.remover = ReadSelector(t, "remover", "fifo");
    if (o.sampler.kind == SelectorKind::kPrioritized ||
        o.remover.kind == SelectorKind::kPrioritized) {
      const double alpha = t.Float("priority_exponent", 1.0, 0.0, 100.0);
      o.sampler.priority_exponent = alpha;
      o.remover.priority_exponent = alpha;
    }
    o.max_times_sampled = static_cast<int32_t>(t.Int("max_times_sampled", 0, 0, 1 << 30));
    ConfigTable limiter = t.Table("rate_limiter");
    o.limiter = ReadLimiter(limiter);
  } else {
    o.max_size = t.RequiredInt("max_size", 1);
    const bool queue = preset == "queue";
    o.sampler = {queue ? SelectorKind::kFifo : SelectorKind::kLifo, 1.0};
    o.remover = o.sampler;
    o.max_times_sampled = 1;
    o.limiter = queue ? *QueueLimiter(std::max<int64_t>(1, o.max_size))
                      : *StackLimiter(std::max<int64_t>(1, o.max_size));
  }
  o.count_unit = t.Enum("count", "items", {"items", "tokens"}) == "tokens" ? CountUnit::kTokens
                                                                           : CountUnit::kItems;
  o.max_staleness = t.Int("max_staleness", -1, -1);
  o.seed = static_cast<uint64_t>(t.Int("seed", 0, 0));
  o.max_item_bytes = t.Int("max_item_bytes", 256ll << 20, 1, 4ll << 30);
  o.blocked_log_capacity = static_cast<size_t>(t.Int("blocked_log_capacity", 4096, 1, 1 << 24));
  o.idempotency_window = t.Int("idempotency_window", 1 << 16, 1, 1 << 24);
  return o;
}

}  // namespace

ReplayConfig ReadReplayConfig(ConfigTable& root) {
  ReplayConfig c;
  ConfigTable r = root.Table("replay");
  c.bind = r.String("bind", c.bind);
  c.storage.path = r.Path("path", "runs/replay/db");
  c.storage.sync_each_write = r.Enum("sync", "per_insert", {"per_insert", "group"}) == "per_insert";
  c.storage.group_commit_ms = r.Int("group_commit_ms", 5, 1, 10000);
  c.storage.compression = r.Enum("compression", "lz4", {"none", "snappy", "lz4", "zstd"});
  c.storage.restore_from = r.Path("restore_from", "");
  c.checkpoint_root = r.Path("checkpoint_dir", "runs/replay/checkpoints");
  c.max_message_bytes = r.Int("max_message_bytes", 512ll << 20, 1024, 8ll << 30);
  c.storage.block_cache_bytes = r.Int("block_cache_mb", 256, 1, 1 << 20) << 20;
  c.storage.write_buffer_bytes = r.Int("write_buffer_mb", 64, 1, 1 << 16) << 20;
  c.max_parked_per_table = r.Int("max_parked_per_table", 4096, 1, 1 << 24);
  c.max_parked_bytes_per_table = r.Int("max_parked_mb_per_table", 1024, 1, 1 << 20) << 20;
  c.max_parked_per_client = r.Int("max_parked_per_client", 256, 1, 1 << 24);
  c.max_parked_bytes_per_client = r.Int("max_parked_mb_per_client", 256, 1, 1 << 20) << 20;
  std::vector<ConfigTable> tables = r.TableArray("tables");
  if (r.present() && tables.empty()) r.Fail("tables", "at least one [[replay.tables]] is required");
  std::set<std::string> names;
  for (ConfigTable& t : tables) {
    TableOptions o = ReadTable(t);
    if (!o.name.empty() && !names.insert(o.name).second) {
      t.Fail("name", "duplicate table name '" + o.name + "'");
    }
    c.tables.push_back(std::move(o));
  }
  return c;
}

StatusOr<ReplayConfig> LoadReplayConfig(const std::string& path, const ConfigSections* sections) {
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseFile(path));
  if (!doc.HasTopLevel("replay")) {
    return InvalidArgumentError(path +
                                ": no [replay] section (expected [replay] with at least one "
                                "[[replay.tables]])");
  }
  ConfigTable root = doc.root();
  ReplayConfig config = ReadReplayConfig(root);
  // A fleet config holds other modules' sections too: their validators read them.
  if (sections != nullptr) {
    ORRERY_RETURN_IF_ERROR(sections->Validate(doc));
  } else {
    ORRERY_RETURN_IF_ERROR(doc.Finish());
  }
  return config;
}

}  // namespace orrery::replay
