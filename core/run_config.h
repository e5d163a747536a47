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
  int threads = 0;             // 0: all hardware threads
  LogLevel log_level = LogLevel::kInfo;
};

// Reads root.[run]; absent keys take the defaults above.
RunConfig ReadRunConfig(ConfigTable& root);

}  // namespace orrery
