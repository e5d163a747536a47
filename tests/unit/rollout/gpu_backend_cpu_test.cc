// The GPU PolicyBackend on the ops' CPU twins against the CPU backend, and the agent loop's
// scheduling on it (tests/gpu/gpu_backend_check.h).
#include <gtest/gtest.h>

#include "tests/gpu/gpu_backend_check.h"

namespace orrery::rollout {
namespace {

// f32 on both sides on the CPU: the tolerance of tests/unit/model/gpu_inference_cpu_test.cc.
TEST(GpuBackendCpuTest, MatchesTheCpuBackendAcrossAWeightUpdate) {
  rollout_check::BackendAcrossWeightUpdate(Device::Cpu(), 1e-5);
}

TEST(GpuBackendCpuTest, ACopiedPromptContinuesAsSeparatePrefills) {
  rollout_check::BackendCopySlot(Device::Cpu(), 1e-5);
}

TEST(GpuBackendCpuTest, AgentSharedPromptsMatchSeparatePrefills) {
  rollout_check::AgentSharedPromptsMatchSeparatePrefills(Device::Cpu());
}

TEST(GpuBackendCpuTest, AgentOnAnOverSubscribedPoolWaitsAndFinishesEveryEpisode) {
  rollout_check::AgentOverSubscribedPoolWaits(Device::Cpu());
}

}  // namespace
}  // namespace orrery::rollout
