// The rate limiter of a replay table, with DeepMind Reverb's exact semantics (rl.md §4).
//
// It keeps the table's cumulative counters (inserts, samples, deletes) and decides whether an
// insert or a sample may proceed now:
//
//   CanSample(n): inserts - deletes < min_size_to_sample  -> false
//                 else inserts * SPI - (samples + forgiven) - n >= min_diff
//   CanInsert(n): inserts + n - deletes <= min_size_to_sample -> true
//                 else (inserts + n) * SPI - (samples + forgiven) <= max_diff
//
// `forgiven` is Orrery's one addition: the samples owed by items the staleness window evicted
// before they were sampled SPI times. Those samples can never be taken; without forgiving them, a
// Queue(n) table blocks every insert for good after n stale evictions while it is empty, and the
// rollouts and the learner wait on each other forever.
//
// Counters are in items, or in tokens when the table counts tokens (then n is a token count and
// min_size_to_sample is in tokens too). The limiter itself never blocks: the table waits on it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "core/status.h"

namespace orrery::replay {

struct RateLimiterOptions {
  double samples_per_insert = 1.0;
  int64_t min_size_to_sample = 1;
  double min_diff = -std::numeric_limits<double>::max();
  double max_diff = std::numeric_limits<double>::max();
};

// Reverb's constructors. Each validates its arguments and returns InvalidArgument with one line.
//
// MinSize(k): sampling starts once k items exist; inserts never block.
StatusOr<RateLimiterOptions> MinSizeLimiter(int64_t min_size_to_sample);
// SampleToInsertRatio with a scalar error buffer e: [min_diff, max_diff] = SPI*min -/+ e.
// Rejected: SPI <= 0, min < 1, max_diff - min_diff < 2*max(1, SPI), min_diff > SPI*min.
StatusOr<RateLimiterOptions> SampleToInsertRatioLimiter(double samples_per_insert,
                                                        int64_t min_size_to_sample,
                                                        double error_buffer);
// The same with [min_diff, max_diff] taken verbatim. Logs a warning when max_diff < SPI*min
// (inserts then block until samples catch up before the table is ever sampleable).
StatusOr<RateLimiterOptions> SampleToInsertRatioLimiter(double samples_per_insert,
                                                        int64_t min_size_to_sample, double min_diff,
                                                        double max_diff);
// Queue(size) and Stack(size): SPI 1, min 1, min_diff 0, max_diff size: every item is sampled
// exactly once and at most `size` items wait.
StatusOr<RateLimiterOptions> QueueLimiter(int64_t size);
StatusOr<RateLimiterOptions> StackLimiter(int64_t size);

// The checks shared by every constructor (also applied to options read from a config):
// SPI > 0, min_size_to_sample >= 1, min_diff <= max_diff.
Status ValidateRateLimiterOptions(const RateLimiterOptions& options);

struct RateLimiterCounters {
  int64_t inserts = 0;
  int64_t samples = 0;
  int64_t deletes = 0;
  double forgiven = 0;  // samples owed by items evicted as stale (cost units)
};

class RateLimiter {
 public:
  explicit RateLimiter(RateLimiterOptions options) : options_(options) {}

  bool CanSample(int64_t n) const;
  bool CanInsert(int64_t n) const;

  void RecordInsert(int64_t n) { counters_.inserts += n; }
  void RecordSample(int64_t n) { counters_.samples += n; }
  void RecordDelete(int64_t n) { counters_.deletes += n; }
  void RecordForgiven(double n) { counters_.forgiven += n; }

  const RateLimiterOptions& options() const { return options_; }
  const RateLimiterCounters& counters() const { return counters_; }
  // Restores counters recovered from storage.
  void set_counters(const RateLimiterCounters& counters) { counters_ = counters; }

 private:
  RateLimiterOptions options_;
  RateLimiterCounters counters_;
};

}  // namespace orrery::replay
