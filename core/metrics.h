// Metric records: the one format every Orrery process reports in.
//
// A record is one JSON object per line (metrics.jsonl in a run directory; the same JSON travels
// over ZeroMQ PUB/SUB to the metrics hub):
//   {"time": 1796000523.456, "source": "learner:0", "step": 120,
//    "metrics": {"loss": 2.31, "lr": 0.001, "expert_load/layer1": [0.9, 1.1, ...]}}
// `time` is Unix seconds, `source` names the actor (role:index), values are numbers or arrays of
// numbers (a histogram, per-expert loads). Names use '/' for grouping; the Prometheus exporter
// maps them to orrery_* series.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace orrery {

struct MetricRecord {
  double time = 0;  // Unix seconds
  std::string source;
  int64_t step = 0;
  std::map<std::string, double> scalars;
  std::map<std::string, std::vector<double>> vectors;

  std::string ToJson() const;  // one line, no newline
  static StatusOr<MetricRecord> FromJson(const std::string& line);
};

double UnixSeconds();

// Appends records to a JSONL file, flushing each line (a crash loses at most a partial line,
// which readers skip).
class MetricsFileWriter {
 public:
  static StatusOr<std::unique_ptr<MetricsFileWriter>> Open(const std::string& path);
  ~MetricsFileWriter();
  Status Write(const MetricRecord& record);

 private:
  explicit MetricsFileWriter(std::FILE* f) : file_(f) {}
  std::mutex mu_;
  std::FILE* file_;
};

// Reads every well-formed record of a JSONL file (malformed lines, e.g. a torn last line, are
// skipped and counted in *skipped when given).
StatusOr<std::vector<MetricRecord>> ReadMetricsFile(const std::string& path,
                                                    int* skipped = nullptr);

}  // namespace orrery
