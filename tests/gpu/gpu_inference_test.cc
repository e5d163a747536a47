// The GPU inference engine (model/gpu/gpu_inference.h) on CUDA against the host model's inference
// path (tests/gpu/gpu_inference_check.h: three slots over small pages with chunked and multi-turn
// prefill and batched decode, a forked prompt with copy-on-write, page accounting over many
// episodes, pool exhaustion), in the f32 debug mode and in bf16; then prefill + decode of a
// sequence of a few thousand tokens against the host's full forward of the same tokens, and the
// GPU PolicyBackend against the CPU one (LoadWeights keeps the caches). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/gpu/gpu_backend_check.h"
#include "tests/gpu/gpu_inference_check.h"
#include "tests/gpu/gpu_test_util.h"

namespace orrery::model {
namespace {

using inference_check::Tolerance;

// f32 mode: fp32 on both sides (no TF32); they differ in summation order (cuBLAS tiles, the KDA
// and MLA-decode kernels' splits, the host's recurrent decode step against the chunked op), about
// 1e-6 relative per op. Through four layers, 1e-4 on the logits is room for that and catches a
// wrong row, page or state (O(1), as the CPU test's mutations show). A near-tie flipped by 1e-6
// may move an expert of a token: at most 1% of the ids.
constexpr Tolerance kF32{1e-4, 0.01};
// bf16 mode: activations, weight copies and latent pages rounded to bf16 (2^-9 = 2e-3 relative
// per rounding), fp32 accumulation and fp32 KDA state. Each logit is the product of a few dozen
// rounded factors through four layers (the training check, tests/gpu/gpu_model_test.cc, allows
// 5e-2 on gradients of the same depth); 5e-2 on the logits while the routing agrees (see
// inference_check::Tolerance), and near-ties of the sigmoid router flipped by bf16 on up to 10%
// of the ids over the test.
constexpr Tolerance kBf16{5e-2, 0.10, true};

TEST(GpuInferenceTest, F32SlotsOverPagesMatchTheHost) {
  SKIP_WITHOUT_GPU();
  inference_check::MultiSlot(Device::Cuda(0), DType::kF32, kF32);
}
TEST(GpuInferenceTest, Bf16SlotsOverPagesMatchTheHost) {
  SKIP_WITHOUT_GPU();
  inference_check::MultiSlot(Device::Cuda(0), DType::kBF16, kBf16);
}
TEST(GpuInferenceTest, F32ForkedPromptEqualsSeparatePrefills) {
  SKIP_WITHOUT_GPU();
  inference_check::Fork(Device::Cuda(0), DType::kF32, kF32);
}
TEST(GpuInferenceTest, Bf16ForkedPromptEqualsSeparatePrefills) {
  SKIP_WITHOUT_GPU();
  inference_check::Fork(Device::Cuda(0), DType::kBF16, kBf16);
}
TEST(GpuInferenceTest, ReleasedEpisodesReturnEveryPage) {
  SKIP_WITHOUT_GPU();
  inference_check::PagesNeverLeak(Device::Cuda(0), DType::kBF16, 1000);
}
TEST(GpuInferenceTest, AnEmptyPoolIsResourceExhausted) {
  SKIP_WITHOUT_GPU();
  inference_check::PoolExhaustion(Device::Cuda(0), DType::kBF16);
}

// Prefill of `prompt` tokens (in chunks of 1024: the multi-chunk path) then `steps` decode steps,
// each step's logits against the host's full forward of the same tokens at that position.
void LongContext(DType dtype, double tol) {
  constexpr int64_t kPrompt = 3000, kSteps = 8;
  auto host = inference_check::HostModel(4096);
  ASSERT_TRUE(host);
  const std::vector<int32_t> seq = inference_check::Tokens(kPrompt + kSteps, 31);
  Batch b;
  b.tokens = Tensor::FromVector<int32_t>({1, static_cast<int64_t>(seq.size())}, seq);
  auto full = host->Forward(b, nullptr);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  auto gpu = inference_check::Upload(*host, Device::Cuda(0), dtype);
  ASSERT_TRUE(gpu);
  GpuInferenceOptions o;
  o.num_slots = 1;
  o.page_size = 64;
  o.prefill_chunk = 1024;
  auto gs = GpuInferenceState::Create(gpu.get(), o);
  ASSERT_TRUE(gs.ok()) << gs.status().ToString();
  ASSERT_TRUE((*gs)->Allocate().ok());
  const int64_t v = host->config().vocab_size;
  auto row = [&](int64_t pos) { return full->Slice(pos, pos + 1).value(); };
  auto step = (*gs)->Prefill({0}, {std::vector<int32_t>(seq.begin(), seq.begin() + kPrompt)});
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  double worst = kernels::testing::RelRmsError(step->logits, row(kPrompt - 1));
  for (int64_t i = 0; i < kSteps; ++i) {
    auto d = (*gs)->DecodeStep({0}, {seq[static_cast<size_t>(kPrompt + i)]});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_EQ(d->logits.shape(), (Shape{1, v}));
    worst = std::max(worst, kernels::testing::RelRmsError(d->logits, row(kPrompt + i)));
  }
  std::printf(
      "%s: prefill %lld + %lld decode steps vs the full forward: worst logits rel RMS %.3g\n",
      std::string(DTypeName(dtype)).c_str(), static_cast<long long>(kPrompt),
      static_cast<long long>(kSteps), worst);
  EXPECT_LT(worst, tol);
}

// Same tolerances as above: the long sequence adds only longer sums (attention over 3000 rows,
// KDA state over 47 chunks), each still accumulated in fp32.
TEST(GpuInferenceTest, F32PrefillAndDecodeEqualTheFullForward) {
  SKIP_WITHOUT_GPU();
  LongContext(DType::kF32, kF32.logits);
}
TEST(GpuInferenceTest, Bf16PrefillAndDecodeEqualTheFullForward) {
  SKIP_WITHOUT_GPU();
  LongContext(DType::kBF16, kBf16.logits);
}

// The GPU PolicyBackend against the CPU one across a weight update (gpu_backend_check.h).
TEST(GpuInferenceTest, GpuBackendMatchesTheCpuBackendAcrossAWeightUpdate) {
  SKIP_WITHOUT_GPU();
  rollout_check::BackendAcrossWeightUpdate(Device::Cuda(0), kF32.logits);
}

}  // namespace
}  // namespace orrery::model
