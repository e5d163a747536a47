// The GPU training step is deterministic (issue 22: "a resumed run continues exactly"), on CUDA
// (tests/gpu/gpu_determinism_check.h): two GPU models made from the same host weights take three
// optimizer steps bit for bit, in bf16 and in the f32 debug mode; GPU pretraining stopped part-way
// and resumed from its checkpoints into freshly built models reproduces the uninterrupted run bit
// for bit. Sizes: a 4096-token batch of a 256-wide model with a 4096-token vocabulary, so the
// step's reductions run over hundreds of blocks (a third of the tokens one embedding row). The ops'
// own run-to-run checks are tests/gpu/determinism_gpu_test.cc. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/device.h"
#include "tests/gpu/gpu_determinism_check.h"

namespace orrery::determinism_check {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

const StepSizes kSteps = {4096, 256, {0, 1500, 1501, 3000, 4096}, 3};

TEST(GpuDeterminismTest, Bf16TrainingStepsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  CheckSameSteps(Device::Cuda(0), DType::kBF16, kSteps);
}

TEST(GpuDeterminismTest, F32TrainingStepsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  CheckSameSteps(Device::Cuda(0), DType::kF32, kSteps);
}

// The MoE layers' shared experts on the side stream (core/cuda_side_stream.h) against the same
// steps with ORRERY_SIDE_STREAM=0 (on the device's stream): not a bit differs, so the overlap
// neither races nor reorders a sum.
TEST(GpuDeterminismTest, Bf16StepsAreBitIdenticalWithAndWithoutTheSideStream) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("ORRERY_SIDE_STREAM", "0", 1), 0);
  CheckSameSteps(Device::Cuda(0), DType::kBF16, kSteps, [] { unsetenv("ORRERY_SIDE_STREAM"); });
  unsetenv("ORRERY_SIDE_STREAM");
}

// Stages of 256- and 1024-token rows, 2048 tokens a step in two micro-batches.
TEST(GpuDeterminismTest, ResumedGpuPretrainingMatchesAnUninterruptedRunBitForBit) {
  SKIP_WITHOUT_GPU();
  CheckResume(Device::Cuda(0), DType::kBF16, {512, 128, 2048, 1024, 256, 1024, 120, 1200});
}

}  // namespace
}  // namespace orrery::determinism_check
