#include "learner/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace orrery {

StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "cosine") return LrScheduleKind::kCosine;
  if (name == "wsd") return LrScheduleKind::kWsd;
  return InvalidArgumentError("unknown learning-rate schedule '" + name +
                              "' (expected constant, cosine or wsd)");
}

double LearningRate(const LrScheduleOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) {
    return o.peak_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  const double floor = o.peak_lr * o.min_ratio;
  const int64_t total = std::max<int64_t>(o.total_steps, o.warmup_steps + 1);
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      return o.peak_lr;
    case LrScheduleKind::kCosine: {
      const double t = std::min(1.0, static_cast<double>(step - o.warmup_steps) /
                                         static_cast<double>(total - o.warmup_steps));
      return floor + (o.peak_lr - floor) * 0.5 * (1.0 + std::cos(M_PI * t));
    }
    case LrScheduleKind::kWsd: {
      const int64_t decay_steps =
          std::max<int64_t>(1, static_cast<int64_t>(std::llround(o.decay_fraction * total)));
      const int64_t decay_start = std::max(o.warmup_steps, total - decay_steps);
      if (step < decay_start) return o.peak_lr;
      const double t =
          std::min(1.0, static_cast<double>(step - decay_start) /
                            static_cast<double>(std::max<int64_t>(1, total - decay_start)));
      return o.peak_lr + (floor - o.peak_lr) * t;
    }
  }
  return o.peak_lr;
}

}  // namespace orrery
