// The RL trainer on the GPU model's orchestration (the ops' CPU twins, f32) against the RL
// trainer on the host model (tests/gpu/rl_trainer_check.h): same statistics, same weights.
#include <gtest/gtest.h>

#include "tests/gpu/rl_trainer_check.h"

namespace orrery::rl {
namespace {

// Both sides compute in f32 on the CPU; they differ in the order of a few sums (about 1e-7
// relative per op, GpuModelCpuTest) and in π_prox of the first step (the host rounds it to f32
// before the ratio, the fused head does not); through AdamW the weights drift apart by those
// roundings, step after step. Measured over three updates of four steps: loss and entropy sums
// within 2e-6 per token, the ratio sum (with ratios up to ~10 after a few clipped steps) within
// 3e-5 relative, grad norms within 1e-5, weights within 3e-5 relative RMS, the same clip counts.
// The tolerances are about 5x those: a wrong loss term, gradient path or a step on the wrong
// π_prox is off by O(1e-2) per token or more.
TEST(RlGpuTrainerCpuTest, GpuPathOnCpuTwinsMatchesHostTrainer) {
  trainer_check::CompareTrainers(Device::Cpu(), DType::kF32, 3, {1e-5, 2e-4, 1.5e-4, 1.5e-4, 1, 1});
}

}  // namespace
}  // namespace orrery::rl
