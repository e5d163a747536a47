// Rate-limiter decisions against Reverb's formulas (rl.md §4) on hand-computed cases, and the
// constructor validation rules.
#include "actors/replay/rate_limiter.h"

#include <gtest/gtest.h>

namespace orrery::replay {
namespace {

struct Case {
  const char* what;
  RateLimiterOptions options;
  RateLimiterCounters counters;
  int64_t n;
  bool can_sample;
  bool can_insert;
};

TEST(RateLimiterTest, DecisionsMatchReverbFormulas) {
  const RateLimiterOptions min_size3 = *MinSizeLimiter(3);
  // SPI 2, min 10, error buffer 5: [min_diff, max_diff] = [15, 25].
  const RateLimiterOptions ratio = *SampleToInsertRatioLimiter(2.0, 10, 5.0);
  const RateLimiterOptions queue2 = *QueueLimiter(2);
  const Case cases[] = {
      // CanSample: size 2 < 3. CanInsert: 2+1-0 = 3 <= 3.
      {"min_size below", min_size3, {2, 0, 0}, 1, false, true},
      // CanSample: 3*1-0-1 = 2 >= -inf. CanInsert: 4 > 3, 4*1-0 <= +inf.
      {"min_size reached", min_size3, {3, 0, 0}, 1, true, true},
      {"min_size many samples", min_size3, {3, 1000000, 0}, 1, true, true},
      // CanSample: 20-0-1 = 19 >= 15. CanInsert: 11 > 10, 22-0 = 22 <= 25.
      {"ratio fresh", ratio, {10, 0, 0}, 1, true, true},
      // CanSample: 20-5-1 = 14 < 15. CanInsert: 22-5 = 17 <= 25.
      {"ratio sampled ahead", ratio, {10, 5, 0}, 1, false, true},
      // CanSample: 20-4-1 = 15 >= 15 (boundary).
      {"ratio boundary", ratio, {10, 4, 0}, 1, true, true},
      // CanInsert: 13 > 10, 26-0 = 26 > 25.
      {"ratio inserted ahead", ratio, {12, 0, 0}, 1, true, false},
      // CanInsert: 13-0 = 13, 26-1 = 25 <= 25 (boundary).
      {"ratio insert boundary", ratio, {12, 1, 0}, 1, true, true},
      // CanSample: size 12-3 = 9 < 10. CanInsert: 12+1-3 = 10 <= 10.
      {"ratio deletes shrink", ratio, {12, 0, 3}, 1, false, true},
      // n = 4: CanSample 24-3-4 = 17 >= 15; CanInsert (12+4)*2-3 = 29 > 25.
      {"ratio batch of 4", ratio, {12, 3, 0}, 4, true, false},
      // n = 6: CanSample 24-3-6 = 15 >= 15.
      {"ratio batch of 6", ratio, {12, 3, 0}, 6, true, false},
      {"ratio batch of 7", ratio, {12, 3, 0}, 7, false, false},
      // Queue(2): SPI 1, min 1, [0, 2].
      {"queue empty", queue2, {0, 0, 0}, 1, false, true},
      // CanSample 1-0-1 = 0 >= 0; CanInsert 2 > 1, 2-0 = 2 <= 2.
      {"queue one", queue2, {1, 0, 0}, 1, true, true},
      // CanInsert 3 > 1, 3-0 = 3 > 2: full.
      {"queue full", queue2, {2, 0, 0}, 1, true, false},
      // After one sample (deleted by max_times_sampled): CanInsert 3-1 = 2 > 1, 3-1 = 2 <= 2.
      {"queue after pop", queue2, {2, 1, 1}, 1, true, true},
      // Everything sampled: CanSample 2-2-1 = -1 < 0.
      {"queue drained", queue2, {2, 2, 1}, 1, false, true},
  };
  for (const Case& c : cases) {
    RateLimiter limiter(c.options);
    limiter.set_counters(c.counters);
    EXPECT_EQ(limiter.CanSample(c.n), c.can_sample) << c.what;
    EXPECT_EQ(limiter.CanInsert(c.n), c.can_insert) << c.what;
  }
}

TEST(RateLimiterTest, ConstructorsGiveReverbParameters) {
  RateLimiterOptions o = *SampleToInsertRatioLimiter(2.0, 10, 5.0);
  EXPECT_EQ(o.min_diff, 15.0);
  EXPECT_EQ(o.max_diff, 25.0);
  o = *SampleToInsertRatioLimiter(4.0, 3, -10.0, 10.0);  // a pair is taken verbatim
  EXPECT_EQ(o.min_diff, -10.0);
  EXPECT_EQ(o.max_diff, 10.0);
  o = *QueueLimiter(7);
  EXPECT_EQ(o.samples_per_insert, 1.0);
  EXPECT_EQ(o.min_size_to_sample, 1);
  EXPECT_EQ(o.min_diff, 0.0);
  EXPECT_EQ(o.max_diff, 7.0);
  o = *StackLimiter(5);
  EXPECT_EQ(o.max_diff, 5.0);
  o = *MinSizeLimiter(4);
  EXPECT_EQ(o.min_size_to_sample, 4);
  EXPECT_LT(o.min_diff, -1e300);
  EXPECT_GT(o.max_diff, 1e300);
}

TEST(RateLimiterTest, RejectsInvalidConfigs) {
  EXPECT_FALSE(MinSizeLimiter(0).ok());
  EXPECT_FALSE(SampleToInsertRatioLimiter(0.0, 1, 10.0).ok());
  EXPECT_FALSE(SampleToInsertRatioLimiter(-1.0, 1, 10.0).ok());
  EXPECT_FALSE(SampleToInsertRatioLimiter(1.0, 0, 10.0).ok());
  // Buffer must be >= 2 * max(1, SPI): SPI 3 needs max_diff - min_diff >= 6.
  EXPECT_FALSE(SampleToInsertRatioLimiter(3.0, 10, 2.9).ok());
  EXPECT_TRUE(SampleToInsertRatioLimiter(3.0, 10, 3.0).ok());
  // SPI 0.5 needs >= 2.
  EXPECT_FALSE(SampleToInsertRatioLimiter(0.5, 10, 0.9).ok());
  EXPECT_TRUE(SampleToInsertRatioLimiter(0.5, 10, 1.0).ok());
  // min_diff > SPI * min (31 > 30): never sampleable.
  StatusOr<RateLimiterOptions> bad = SampleToInsertRatioLimiter(3.0, 10, 31.0, 40.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("min_diff"), std::string::npos);
  EXPECT_TRUE(SampleToInsertRatioLimiter(3.0, 10, 30.0, 40.0).ok());
  // max_diff < SPI * min only warns.
  EXPECT_TRUE(SampleToInsertRatioLimiter(3.0, 10, 0.0, 20.0).ok());
  EXPECT_FALSE(QueueLimiter(0).ok());
  EXPECT_FALSE(StackLimiter(-1).ok());
  EXPECT_FALSE(ValidateRateLimiterOptions({1.0, 1, 5.0, 4.0}).ok());
}

}  // namespace
}  // namespace orrery::replay
