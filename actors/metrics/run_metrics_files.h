// Reading the metrics.jsonl files of a run directory, whole or as they grow.
//
// Every actor appends MetricRecord JSON lines to `metrics.jsonl` in the run directory, or in its
// own sub-directory of it (`DIR/<actor>/metrics.jsonl`); both places are read, and the launcher's
// `DIR/fleet_metrics.jsonl` (each actor's state and restarts). A line is taken only
// once it ends in '\n', so a record being written is never read half; malformed complete lines are
// skipped and counted.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "core/status.h"

namespace orrery {

// DIR/metrics.jsonl, DIR/fleet_metrics.jsonl and DIR/*/metrics.jsonl that exist, sorted. Fails
// when DIR does not exist or is not a directory.
StatusOr<std::vector<std::string>> FindRunMetricsFiles(const std::string& run_dir);

// Follows the metric files of a run directory: each Poll returns the records appended since the
// previous one (files that appear later are picked up too).
class RunMetricsTailer {
 public:
  explicit RunMetricsTailer(std::string run_dir) : run_dir_(std::move(run_dir)) {}
  Status Poll(std::vector<MetricRecord>* records);
  int64_t malformed_lines() const { return malformed_; }

 private:
  std::string run_dir_;
  std::map<std::string, uint64_t> offsets_;  // bytes consumed per file
  int64_t malformed_ = 0;
};

// Every record of the run, ordered by time (ties keep file order). Fails when the run has no
// metric file.
StatusOr<std::vector<MetricRecord>> ReadRunMetrics(const std::string& run_dir,
                                                   int64_t* malformed = nullptr);

}  // namespace orrery
