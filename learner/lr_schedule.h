// Learning-rate schedules over optimizer steps: linear warmup, then constant, cosine decay, or
// WSD (warmup-stable-decay: constant until the last `decay_fraction` of the run, then a linear
// decay). All decay to peak * min_ratio at total_steps; steps past the end stay there.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace orrery {

enum class LrScheduleKind { kConstant, kCosine, kWsd };

struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::kWsd;
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_ratio = 0.1;       // final lr / peak lr (cosine, wsd)
  double decay_fraction = 0.2;  // wsd: share of total_steps spent decaying
};

StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name);  // constant|cosine|wsd

// The learning rate for optimizer step `step` (0-based).
double LearningRate(const LrScheduleOptions& options, int64_t step);

}  // namespace orrery
