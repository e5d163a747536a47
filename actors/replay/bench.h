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

}  // namespace orrery::replay
