#include "actors/replay/rate_limiter.h"

#include <algorithm>
#include <cmath>

#include "core/logging.h"

namespace orrery::replay {

Status ValidateRateLimiterOptions(const RateLimiterOptions& options) {
  if (!(options.samples_per_insert > 0) || !std::isfinite(options.samples_per_insert)) {
    return InvalidArgumentError("rate limiter: samples_per_insert must be > 0, got " +
                                std::to_string(options.samples_per_insert));
  }
  if (options.min_size_to_sample < 1) {
    return InvalidArgumentError("rate limiter: min_size_to_sample must be >= 1, got " +
                                std::to_string(options.min_size_to_sample));
  }
  if (std::isnan(options.min_diff) || std::isnan(options.max_diff) ||
      options.min_diff > options.max_diff) {
    return InvalidArgumentError("rate limiter: min_diff (" + std::to_string(options.min_diff) +
                                ") must be <= max_diff (" + std::to_string(options.max_diff) + ")");
  }
  return Status::OK();
}

StatusOr<RateLimiterOptions> MinSizeLimiter(int64_t min_size_to_sample) {
  RateLimiterOptions options;
  options.min_size_to_sample = min_size_to_sample;
  ORRERY_RETURN_IF_ERROR(ValidateRateLimiterOptions(options));
  return options;
}

StatusOr<RateLimiterOptions> SampleToInsertRatioLimiter(double samples_per_insert,
                                                        int64_t min_size_to_sample,
                                                        double error_buffer) {
  if (!(error_buffer >= 0)) {
    return InvalidArgumentError("rate limiter: error_buffer must be >= 0, got " +
                                std::to_string(error_buffer));
  }
  const double offset = samples_per_insert * static_cast<double>(min_size_to_sample);
  return SampleToInsertRatioLimiter(samples_per_insert, min_size_to_sample, offset - error_buffer,
                                    offset + error_buffer);
}

StatusOr<RateLimiterOptions> SampleToInsertRatioLimiter(double samples_per_insert,
                                                        int64_t min_size_to_sample, double min_diff,
                                                        double max_diff) {
  RateLimiterOptions options{samples_per_insert, min_size_to_sample, min_diff, max_diff};
  ORRERY_RETURN_IF_ERROR(ValidateRateLimiterOptions(options));
  const double needed = 2.0 * std::max(1.0, samples_per_insert);
  if (max_diff - min_diff < needed) {
    return InvalidArgumentError(
        "rate limiter: the error buffer (max_diff - min_diff = " +
        std::to_string(max_diff - min_diff) + ") must be >= 2 * max(1, samples_per_insert) = " +
        std::to_string(needed) + ", else inserts and samples can block each other forever");
  }
  const double offset = samples_per_insert * static_cast<double>(min_size_to_sample);
  if (min_diff > offset) {
    return InvalidArgumentError("rate limiter: min_diff (" + std::to_string(min_diff) +
                                ") must be <= samples_per_insert * min_size_to_sample (" +
                                std::to_string(offset) + "), else the table can never be sampled");
  }
  if (max_diff < offset) {
    ORRERY_LOG(WARN) << "rate limiter: max_diff (" << max_diff
                     << ") < samples_per_insert * min_size_to_sample (" << offset
                     << "): inserts will block before the table reaches min_size_to_sample";
  }
  return options;
}

StatusOr<RateLimiterOptions> QueueLimiter(int64_t size) {
  if (size < 1) {
    return InvalidArgumentError("rate limiter: queue size must be >= 1, got " +
                                std::to_string(size));
  }
  return RateLimiterOptions{1.0, 1, 0.0, static_cast<double>(size)};
}

StatusOr<RateLimiterOptions> StackLimiter(int64_t size) {
  if (size < 1) {
    return InvalidArgumentError("rate limiter: stack size must be >= 1, got " +
                                std::to_string(size));
  }
  return RateLimiterOptions{1.0, 1, 0.0, static_cast<double>(size)};
}

bool RateLimiter::CanSample(int64_t n) const {
  if (counters_.inserts - counters_.deletes < options_.min_size_to_sample) return false;
  const double diff = static_cast<double>(counters_.inserts) * options_.samples_per_insert -
                      static_cast<double>(counters_.samples) - counters_.forgiven -
                      static_cast<double>(n);
  return diff >= options_.min_diff;
}

bool RateLimiter::CanInsert(int64_t n) const {
  if (counters_.inserts + n - counters_.deletes <= options_.min_size_to_sample) return true;
  const double diff = static_cast<double>(counters_.inserts + n) * options_.samples_per_insert -
                      static_cast<double>(counters_.samples) - counters_.forgiven;
  return diff <= options_.max_diff;
}

}  // namespace orrery::replay
