// The [run] section shared by every Orrery job: where outputs go, the seed, determinism, threads,
// logging.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/logging.h"

namespace orrery {

struct RunConfig {
  std::string name = "run";
  std::string dir = "runs/run";  // outputs: checkpoints, metrics, logs
  uint64_t seed = 0;
  bool deterministic = false;  // fixed reduction orders: bit-identical results across runs
  int threads =
      0;  // threads of the default pool (ORRERY_NUM_THREADS wins); 0: all hardware threads
  LogLevel log_level = LogLevel::kInfo;
};

// Reads root.[run]; absent keys take the defaults above.
RunConfig ReadRunConfig(ConfigTable& root);

// Puts [run] into effect for this process: the log level, and the size of the default thread pool
// (ThreadPool::SetDefaultThreads(threads): ORRERY_NUM_THREADS, when set, takes precedence). Call
// once at startup, before any parallel work. Returns the number of threads in effect.
int ApplyRunConfig(const RunConfig& run);

}  // namespace orrery
