// The GPU model's orchestration (model/gpu: its layers, caches and gradient flow) on the ops' CPU
// twins against the host model, on a machine without a GPU: the same whole-model check as
// tests/gpu/gpu_model_test.cc (tests/gpu/gpu_model_check.h), the trainer path (GpuTrainable,
// AdamW) on the same parameters, and the trainer's determinism checks of
// tests/gpu/gpu_determinism_check.h (same steps twice; pretraining resumed from checkpoints).
#include <gtest/gtest.h>

#include "learner/adamw.h"
#include "learner/gpu_trainable.h"
#include "tests/gpu/gpu_determinism_check.h"
#include "tests/gpu/gpu_model_check.h"

namespace orrery::model {
namespace {

// Both sides compute in f32 on the CPU with the same reference kernels; they differ in the order
// of a few sums (the KDA op's fused transforms against the layer's separate L2 norm and gate, the
// expert products per stacked view, the LM head chunked over tokens), about 1e-7 relative per op.
// 1e-5 for the loss and 1e-4 for every parameter gradient leave a wide margin over that and are
// far below the O(1) error of a wrong formula or a missing gradient path.
TEST(GpuModelCpuTest, OrchestrationOnCpuTwinsMatchesHostModel) {
  gpu_check::CompareWithHost(Device::Cpu(), DType::kF32, 1e-5, 1e-4);
}

// The same check with the KDA layers' low-rank output gate (D -> 8 -> H*V plus a bias): before
// this path existed GpuModel::FromHost refused the config.
TEST(GpuModelCpuTest, LowRankOutputGateMatchesHostModel) {
  gpu_check::CompareWithHost(Device::Cpu(), DType::kF32, 1e-5, 1e-4, 8);
}

// Recomputing each layer in the backward (with the forward's routing) runs the same ops on the
// same inputs: on the CPU twins the gradients are bit-identical to keeping the activations.
TEST(GpuModelCpuTest, RecomputedLayersGiveTheSameGradients) {
  auto config = gpu_check::EveryLayerKind();
  ASSERT_TRUE(config.ok());
  auto host = Model::Create(*config, 31, DType::kF32);
  ASSERT_TRUE(host.ok());
  std::vector<std::vector<float>> grads[2];
  double losses[2] = {0, 0};
  for (int recompute = 0; recompute < 2; ++recompute) {
    GpuModelOptions o;
    o.device = Device::Cpu();
    o.compute_dtype = DType::kF32;
    o.recompute_layers = recompute == 1;
    auto gpu = GpuModel::FromHost(**host, o);
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    auto loss = (*gpu)->ForwardBackward(gpu_check::RandomBatch(3), 1e-3, true);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    losses[recompute] = loss->loss_sum;
    for (const GpuParameter& p : (*gpu)->parameters()) {
      const float* g = p.grad.data<float>();
      grads[recompute].emplace_back(g, g + p.grad.numel());
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_EQ(grads[0][i], grads[1][i]) << i;
}

TEST(GpuModelCpuTest, Bf16OnTheCpuIsRefused) {
  auto config = gpu_check::EveryLayerKind();
  ASSERT_TRUE(config.ok());
  auto host = Model::Create(*config, 1, DType::kF32);
  ASSERT_TRUE(host.ok());
  GpuModelOptions o;
  o.device = Device::Cpu();
  o.compute_dtype = DType::kBF16;
  auto gpu = GpuModel::FromHost(**host, o);
  ASSERT_FALSE(gpu.ok());
  EXPECT_NE(gpu.status().message().find("must be f32"), std::string::npos);
}

TEST(GpuModelCpuTest, TrainerStepsLowerTheLoss) {
  auto config = gpu_check::EveryLayerKind();
  ASSERT_TRUE(config.ok());
  auto host = Model::Create(*config, 29, DType::kF32);
  ASSERT_TRUE(host.ok());
  GpuModelOptions o;
  o.device = Device::Cpu();
  o.compute_dtype = DType::kF32;
  auto gpu = GpuModel::FromHost(**host, o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  GpuTrainable trainable(gpu->get());
  auto adamw = AdamW::Create(AdamWOptions{}, trainable.Parameters());
  ASSERT_TRUE(adamw.ok()) << adamw.status().ToString();
  const GpuBatch b = gpu_check::RandomBatch(7);
  PackedBatch packed;
  packed.rows = 1;
  packed.seq_len = gpu_check::kTokens;
  packed.inputs = b.tokens;
  packed.targets = b.targets;
  packed.cu_seqlens.assign(gpu_check::kCu.begin(), gpu_check::kCu.end());
  for (int32_t t : b.targets) packed.num_targets += t >= 0;
  double first = 0, last = 0;
  for (int step = 0; step < 6; ++step) {
    ASSERT_TRUE(adamw->ZeroGrad().ok());
    auto l = trainable.ForwardBackward(packed, 1.0 / packed.num_targets);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ASSERT_TRUE(trainable.UpdateBalancing().ok());
    ASSERT_TRUE(adamw->ClipGradNorm(1.0).ok());
    ASSERT_TRUE(adamw->Step(3e-3).ok());
    (step == 0 ? first : last) = l->loss_sum / l->tokens;
  }
  EXPECT_LT(last, first - 0.05) << first << " -> " << last;
}

// The GPU trainer's orchestration is deterministic on the CPU twins: the same steps twice, and
// GPU-model pretraining (checkpoints of its masters, moments and balancing biases) resumed into
// fresh models. On CUDA the same checks run at larger sizes (tests/gpu/gpu_determinism_test.cc).
TEST(GpuModelCpuTest, TrainingStepsAreBitIdentical) {
  determinism_check::CheckSameSteps(Device::Cpu(), DType::kF32,
                                    {256, 64, {0, 200, 201, 380, 512}, 2});
}

TEST(GpuModelCpuTest, ResumedPretrainingMatchesAnUninterruptedRunBitForBit) {
  determinism_check::CheckResume(Device::Cpu(), DType::kF32, {256, 64, 512, 256, 32, 128, 60, 120});
}

}  // namespace
}  // namespace orrery::model
