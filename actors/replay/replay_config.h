// The [replay] config section: where the store lives, how it syncs, where it listens, and its
// tables ([[replay.tables]]). Read strictly through core/config.h; `orrery config check` runs
// the same reader (registered in actors/replay/commands.cc).
//
//   [replay]
//   bind = "tcp://127.0.0.1:5555"
//   path = "runs/replay/db"          # relative paths: against the config file's directory
//   sync = "per_insert"              # or "group": fsync the WAL every group_commit_ms
//   [[replay.tables]]
//   name = "trajectories"
//   sampler = "uniform"
//   remover = "fifo"
//   max_size = 100000
//   [replay.tables.rate_limiter]
//   kind = "sample_to_insert_ratio"
//   samples_per_insert = 2.0
//   min_size_to_sample = 64
//   error_buffer = 128.0
//
// A table may instead say preset = "queue" or "stack" (Reverb's Table.queue/stack: Fifo/Lifo
// sampler and remover, max_times_sampled 1, Queue/Stack(max_size) limiter); then sampler,
// remover, max_times_sampled and rate_limiter are not accepted. docs/replay.md lists every key.
#pragma once

#include <string>
#include <vector>

#include "actors/replay/storage.h"
#include "actors/replay/table.h"
#include "core/config.h"

namespace orrery::replay {

struct ReplayConfig {
  std::string bind = "tcp://127.0.0.1:5555";
  StorageOptions storage;
  std::string checkpoint_root;  // where unnamed checkpoints go
  int64_t max_message_bytes = 512ll << 20;
  // Requests parked on a rate limiter (or behind one that is), and the payload bytes they hold:
  // a request beyond a limit is refused at once with ResourceExhausted. A client is one ZeroMQ
  // peer (routing id).
  int64_t max_parked_per_table = 4096;
  int64_t max_parked_bytes_per_table = 1ll << 30;
  int64_t max_parked_per_client = 256;
  int64_t max_parked_bytes_per_client = 256ll << 20;
  std::vector<TableOptions> tables;
};

// Reads root.[replay]. Errors, the rate-limiter rules included, are recorded in the document
// (its Finish() reports the first).
ReplayConfig ReadReplayConfig(ConfigTable& root);

// Parses `path` and reads [replay]; then runs `sections` (every module's validators, so a fleet
// config with other sections is accepted) or, when null, Finish(). One-line errors naming the
// file, the key and what was expected.
StatusOr<ReplayConfig> LoadReplayConfig(const std::string& path,
                                        const ConfigSections* sections = nullptr);

}  // namespace orrery::replay
