// The replay store benchmark behind `orrery replay bench`: inserts/s, MB/s, samples/s and
// p50/p99 latency through the replay actor over loopback with 1 and N clients, and in the same
// run raw RocksDB Put/Get of the same bytes (the limit). Prints one markdown table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace orrery::replay {

struct ReplayBenchOptions {
  std::string dir;  // scratch directory (removed afterwards)
  std::vector<int64_t> sizes = {4096, 65536, 1 << 20};
  std::vector<int> clients = {1, 8};
  int64_t bytes_per_run = 256ll << 20;  // items per size = this / size (capped)
  int64_t max_items = 4000;
  bool group_commit = true;  // else fsync per insert (both sides)
};

Status RunReplayBench(const ReplayBenchOptions& options);

// `orrery replay bench --soak`: the store in a child process (served over loopback TCP), filled
// to max_size (`table_bytes` of payload, evicting FIFO from then on), then `clients` threads
// each inserting and sampling in turn for `seconds`. Prints, every `report_every_s`, the
// insert and sample rates, the store's resident memory (VmRSS of the child) and the table's
// bytes; then throughput, p50/p99 latency of inserts and samples, and the RSS range after the
// warm-up (the fill and the first `warmup_s` seconds of the timed run, while the block cache and
// memtables reach their size) as a spread in percent.
struct ReplaySoakOptions {
  std::string dir;  // scratch directory (removed afterwards)
  int clients = 64;
  int seconds = 60;
  int report_every_s = 5;
  int warmup_s = 10;
  int64_t item_bytes = 16 << 10;
  int64_t block_cache_bytes = 16ll << 20;
  int64_t write_buffer_bytes = 8ll << 20;
  int64_t table_bytes = 160ll << 20;  // max_size = table_bytes / item_bytes
  bool group_commit = true;
};

Status RunReplaySoak(const ReplaySoakOptions& options);

}  // namespace orrery::replay
