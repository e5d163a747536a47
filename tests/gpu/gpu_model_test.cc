// The GPU model (model/gpu/gpu_model.h) on CUDA against the host model, its oracle
// (tests/gpu/gpu_model_check.h: every layer kind, documents over several KDA chunks, forced
// routing), in the f32 debug mode and in bf16; then the GPU trainer's steps (GpuTrainable + AdamW
// on the device) lower the loss and its weights load into the host model. Skipped without a GPU.
#include "model/gpu/gpu_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "core/config.h"
#include "core/device.h"
#include "core/philox.h"
#include "learner/adamw.h"
#include "learner/cross_entropy.h"
#include "learner/gpu_trainable.h"
#include "model/config.h"
#include "model/model.h"
#include "tests/gpu/gpu_model_check.h"

namespace orrery::model {
namespace {

using gpu_check::CompareWithHost;
using gpu_check::EveryLayerKind;
using gpu_check::kCu;
using gpu_check::kTokens;
using gpu_check::RandomBatch;

#define SKIP_WITHOUT_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

// f32 mode: the same maths in fp32 on both sides (no TF32); they differ in summation order
// (cuBLAS tiles, the GPU kernels' own fixed orders in the embedding scatter and the KDA f32
// kernels) and in
// transcendental implementations, about 1e-6 relative per op. Through four layers, the residual
// stream and the backward that amplifies it by at most a few times per layer, 1e-4 for the loss
// and 1e-3 for every parameter gradient leave room for that and catch a wrong formula (O(1)).
TEST(GpuModelTest, F32ModeMatchesHostModel) {
  SKIP_WITHOUT_GPU();
  CompareWithHost(Device::Cuda(0), DType::kF32, 1e-4, 1e-3);
}

// bf16 mode: activations and weight copies rounded to bf16 (relative 2^-9 = 2e-3 per rounding),
// fp32 accumulation. The loss is a mean over hundreds of tokens and errs like one rounding
// (issue 22 asks for 1e-2). Gradients: each is a product of a few dozen rounded factors along its
// path through up to four layers; the KDA op alone errs up to 2e-2 on dg/dbeta (spec §2.8,
// fla's tolerances), so 5e-2 per parameter is twice the core's own bound.
TEST(GpuModelTest, Bf16ModeMatchesHostModel) {
  SKIP_WITHOUT_GPU();
  CompareWithHost(Device::Cuda(0), DType::kBF16, 1e-2, 5e-2);
}

// The KDA layers' low-rank output gate with a bias (D -> 8 -> H*V), at the tolerances above.
TEST(GpuModelTest, LowRankOutputGateMatchesHostModel) {
  SKIP_WITHOUT_GPU();
  CompareWithHost(Device::Cuda(0), DType::kF32, 1e-4, 1e-3, 8);
  CompareWithHost(Device::Cuda(0), DType::kBF16, 1e-2, 5e-2, 8);
}

// The GPU trainer: AdamW on the device over GpuTrainable's parameters lowers the loss of a
// repeated batch, and the trained masters load into the host model, which then computes the same
// loss (the checkpoint path: host names, host shapes).
TEST(GpuModelTest, TrainerStepsLowerTheLossAndWeightsLoadOnTheHost) {
  SKIP_WITHOUT_GPU();
  StatusOr<ModelConfig> config = EveryLayerKind();
  ASSERT_TRUE(config.ok());
  auto host = Model::Create(*config, 29, DType::kF32);
  ASSERT_TRUE(host.ok());
  GpuModelOptions o;
  o.compute_dtype = DType::kF32;
  auto gpu = GpuModel::FromHost(**host, o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  GpuTrainable trainable(gpu->get());
  AdamWOptions ao;
  auto adamw = AdamW::Create(ao, trainable.Parameters());
  ASSERT_TRUE(adamw.ok()) << adamw.status().ToString();
  ASSERT_TRUE(adamw->on_device());
  const GpuBatch batch = RandomBatch(7);
  PackedBatch packed;
  packed.rows = 1;
  packed.seq_len = kTokens;
  packed.inputs = batch.tokens;
  packed.targets = batch.targets;
  packed.cu_seqlens.assign(kCu.begin(), kCu.end());
  for (int32_t t : batch.targets) packed.num_targets += t >= 0;
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    ASSERT_TRUE(adamw->ZeroGrad().ok());
    auto l = trainable.ForwardBackward(packed, 1.0 / packed.num_targets);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    auto balance = trainable.UpdateBalancing();
    ASSERT_TRUE(balance.ok()) << balance.status().ToString();
    auto norm = adamw->ClipGradNorm(1.0);
    ASSERT_TRUE(norm.ok());
    EXPECT_TRUE(std::isfinite(*norm));
    ASSERT_TRUE(adamw->Step(3e-3).ok());
    (step == 0 ? first : last) = l->loss_sum / l->tokens;
  }
  std::printf("loss %.5f -> %.5f over 8 steps\n", first, last);
  EXPECT_LT(last, first - 0.05);
  auto eval = trainable.Evaluate(packed);
  ASSERT_TRUE(eval.ok());
  ASSERT_TRUE((*gpu)->CopyToHost(host->get()).ok());
  Batch hb;
  hb.tokens = Tensor::FromVector<int32_t>({1, kTokens}, batch.tokens);
  hb.cu_seqlens = Tensor::FromVector<int64_t>({static_cast<int64_t>(kCu.size())}, kCu);
  auto logits = (*host)->Forward(hb, nullptr);
  ASSERT_TRUE(logits.ok());
  auto host_loss = CrossEntropy(*logits, batch.targets, 0, nullptr);
  ASSERT_TRUE(host_loss.ok());
  // Same weights and biases, routing chosen independently on each side: equal to f32 rounding
  // unless a near-tie flips an expert, which 1e-3 would still show as a mismatch of a few tokens.
  EXPECT_NEAR(host_loss->loss_sum / host_loss->tokens, eval->loss_sum / eval->tokens, 1e-3);
}

TEST(GpuModelTest, BadBatchesAreOneLineErrors) {
  SKIP_WITHOUT_GPU();
  StatusOr<ModelConfig> config = EveryLayerKind();
  ASSERT_TRUE(config.ok());
  auto host = Model::Create(*config, 1, DType::kF32);
  ASSERT_TRUE(host.ok());
  auto gpu = GpuModel::FromHost(**host, GpuModelOptions{});
  ASSERT_TRUE(gpu.ok());
  GpuBatch b = RandomBatch(1);
  b.tokens[4] = 131;
  auto s = (*gpu)->ForwardBackward(b, 1.0, true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("outside the vocabulary"), std::string::npos);
  b = RandomBatch(1);
  b.cu_seqlens = {0, 100, 90, kTokens};
  EXPECT_FALSE((*gpu)->ForwardBackward(b, 1.0, true).ok());
}

}  // namespace
}  // namespace orrery::model
