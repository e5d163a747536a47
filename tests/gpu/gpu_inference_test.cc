// The GPU inference engine (model/gpu/gpu_inference.h) on CUDA against the host model's inference
// path (tests/gpu/gpu_inference_check.h: three slots over small pages with chunked and multi-turn
// prefill and batched decode, a forked prompt with copy-on-write, page accounting over many
// episodes, pool exhaustion), in the f32 debug mode and in bf16, with the absorbed form and with
// the MHA-form prefill for longer feeds; then prefill + decode of a sequence of a few thousand
// tokens, and a 14.5K-token one in both MLA forms (chunks, a second turn), against the host's
// full forward of the same tokens, and the GPU PolicyBackend against the CPU one (LoadWeights
// keeps the caches). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

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

// Long-context prefill in both MLA forms (GpuInferenceOptions::mha_prefill_min_tokens: 1024, the
// MHA form, or 0, the absorbed form only) against the host's full forward of the same tokens, in
// a model with K3's MLA head widths (qk 192, v 128: the tensor-core prefix-causal kernel in bf16):
// a 12000-token prompt in chunks of 4096 (three passes over one scratch of keys and values), four
// decode steps, a second turn of 2500 tokens (the MHA form decompresses the 12004 cached tokens
// from their pages first), four more decode steps. Every call's logits row is compared with the
// full forward's row at that position and with the other form's; the MHA-form state must have
// fed every prefill token in the MHA form and the absorbed one none.
//
// bf16: routing near-ties flip on a few percent of the ~87K ids (inference_check::Tolerance); a
// flip in the context moves the compared row little (attention averages over thousands of rows,
// the KDA state decays), a flip at the compared position itself by 10-15%, so a row is compared
// where the ids of its own position agree (at least half the rows must be), and the ids differing
// over the whole sequence are bounded as in the short tests.
struct LongReference {
  std::vector<int32_t> seq;
  Tensor logits;  // f32 [N, V]
  Tensor ids;     // i32 [moe layers, N, top_k]
};
constexpr int64_t kLongPrompt = 12000, kLongTurn = 2500, kLongSteps = 4, kLongChunk = 4096;

const LongReference& Reference(Model& host) {
  static LongReference* ref = [&] {
    auto* r = new LongReference;
    r->seq = inference_check::Tokens(kLongPrompt + kLongTurn + 2 * kLongSteps, 37);
    Batch b;
    b.tokens = Tensor::FromVector<int32_t>({1, static_cast<int64_t>(r->seq.size())}, r->seq);
    ForwardCache cache;
    auto full = host.Forward(b, &cache);
    EXPECT_TRUE(full.ok()) << full.status().ToString();
    if (full.ok()) r->logits = *full;
    r->ids = cache.StackedExpertIds();
    return r;
  }();
  return *ref;
}

struct LongRun {
  std::vector<Tensor> logits;  // per call [1, V]
  std::vector<int64_t> rows;   // per call: the position its logits are for
  Tensor ids;                  // i32 [moe layers, N, top_k], the engine's, in token order
  int64_t mha_tokens = 0;
};

void RunLong(Model& host, const LongReference& ref, DType dtype, int64_t mha_min_tokens,
             LongRun* run) {
  auto gpu = inference_check::Upload(host, Device::Cuda(0), dtype);
  ASSERT_TRUE(gpu);
  GpuInferenceOptions o;
  o.num_slots = 1;
  o.page_size = 64;
  o.prefill_chunk = kLongChunk;
  o.mha_prefill_min_tokens = mha_min_tokens;
  auto gs = GpuInferenceState::Create(gpu.get(), o);
  ASSERT_TRUE(gs.ok()) << gs.status().ToString();
  ASSERT_TRUE((*gs)->Allocate().ok());
  const int64_t n = static_cast<int64_t>(ref.seq.size());
  run->ids = Tensor::Zeros(ref.ids.shape(), DType::kI32);
  const int64_t layers = ref.ids.dim(0), k = ref.ids.dim(2);
  int64_t at = 0;
  auto feed = [&](int64_t m) {
    const std::vector<int32_t> t(ref.seq.begin() + at, ref.seq.begin() + at + m);
    auto out = m == 1 ? (*gs)->DecodeStep({0}, t) : (*gs)->Prefill({0}, {t});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    run->logits.push_back(out->logits);
    run->rows.push_back(at + m - 1);
    for (int64_t l = 0; l < layers; ++l) {
      std::copy_n(out->expert_ids.data<int32_t>() + l * m * k, m * k,
                  run->ids.data<int32_t>() + (l * n + at) * k);
    }
    at += m;
  };
  feed(kLongPrompt);
  for (int64_t i = 0; i < kLongSteps; ++i) feed(1);
  feed(kLongTurn);
  for (int64_t i = 0; i < kLongSteps; ++i) feed(1);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(at, n);
  run->mha_tokens = (*gs)->mha_prefill_tokens();
}

// Whether `ids` and `other` agree at position `row` in every MoE layer.
bool SameRouting(const Tensor& ids, const Tensor& other, int64_t row) {
  const int64_t layers = ids.dim(0), n = ids.dim(1), k = ids.dim(2);
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t j = 0; j < k; ++j) {
      if (ids.data<int32_t>()[(l * n + row) * k + j] !=
          other.data<int32_t>()[(l * n + row) * k + j]) {
        return false;
      }
    }
  }
  return true;
}

void LongPrefillBothForms(DType dtype, const Tolerance& tol) {
  auto host = inference_check::HostModel(16384, /*k3_mla_dims=*/true);
  ASSERT_TRUE(host);
  const LongReference& ref = Reference(*host);
  ASSERT_TRUE(ref.logits.defined());
  LongRun mha, absorbed;
  RunLong(*host, ref, dtype, 1024, &mha);
  if (::testing::Test::HasFatalFailure()) return;
  RunLong(*host, ref, dtype, 0, &absorbed);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(mha.mha_tokens, kLongPrompt + kLongTurn) << "the prefills ran in the MHA form";
  EXPECT_EQ(absorbed.mha_tokens, 0);
  const bool bf16 = tol.until_routing_differs;
  for (const auto& [name, run] :
       {std::pair<const char*, const LongRun&>{"mha", mha}, {"absorbed", absorbed}}) {
    double worst = 0;
    int64_t checked = 0, differing = 0;
    for (size_t c = 0; c < run.logits.size(); ++c) {
      const int64_t row = run.rows[c];
      if (bf16 && !SameRouting(run.ids, ref.ids, row)) continue;
      const double err =
          kernels::testing::RelRmsError(run.logits[c], ref.logits.Slice(row, row + 1).value());
      worst = std::max(worst, err);
      ++checked;
      EXPECT_LT(err, tol.logits) << name << " form, position " << row;
    }
    for (int64_t i = 0; i < run.ids.numel(); ++i) {
      differing += run.ids.data<int32_t>()[i] != ref.ids.data<int32_t>()[i];
    }
    std::printf(
        "%s %s form: %zu calls, worst logits rel RMS vs the full forward %.3g over %lld rows, "
        "expert ids differing %lld of %lld\n",
        std::string(DTypeName(dtype)).c_str(), name, run.logits.size(), worst,
        static_cast<long long>(checked), static_cast<long long>(differing),
        static_cast<long long>(run.ids.numel()));
    EXPECT_GE(2 * checked, static_cast<int64_t>(run.logits.size())) << name;
    EXPECT_LE(static_cast<double>(differing), tol.ids * static_cast<double>(run.ids.numel()))
        << name;
  }
  // The two forms on the same feed.
  double worst = 0;
  for (size_t c = 0; c < mha.logits.size(); ++c) {
    if (bf16 && !SameRouting(mha.ids, absorbed.ids, mha.rows[c])) continue;
    const double err = kernels::testing::RelRmsError(mha.logits[c], absorbed.logits[c]);
    worst = std::max(worst, err);
    EXPECT_LT(err, tol.logits) << "mha vs absorbed, position " << mha.rows[c];
  }
  std::printf("%s: mha vs absorbed form worst logits rel RMS %.3g\n",
              std::string(DTypeName(dtype)).c_str(), worst);
}

// The tolerances of the tests above: the long context only lengthens f32 sums (attention over
// 14.5K rows: sqrt(14500) * 6e-8 ~ 7e-6 relative; KDA state over 227 chunks).
TEST(GpuInferenceTest, F32LongPrefillInBothFormsEqualsTheFullForward) {
  SKIP_WITHOUT_GPU();
  LongPrefillBothForms(DType::kF32, kF32);
}
TEST(GpuInferenceTest, Bf16LongPrefillInBothFormsEqualsTheFullForward) {
  SKIP_WITHOUT_GPU();
  LongPrefillBothForms(DType::kBF16, kBf16);
}

// The MHA-form prefill in the multi-slot and fork scenarios (gpu_inference_check.h): feeds of 8
// (7) tokens and more take it, beside absorbed ones in the same call; the same host comparison.
TEST(GpuInferenceTest, F32MhaFormSlotsMatchTheHost) {
  SKIP_WITHOUT_GPU();
  inference_check::MultiSlot(Device::Cuda(0), DType::kF32, kF32, 8);
  inference_check::Fork(Device::Cuda(0), DType::kF32, kF32, 7);
}
TEST(GpuInferenceTest, Bf16MhaFormSlotsMatchTheHost) {
  SKIP_WITHOUT_GPU();
  inference_check::MultiSlot(Device::Cuda(0), DType::kBF16, kBf16, 8);
  inference_check::Fork(Device::Cuda(0), DType::kBF16, kBf16, 7);
}

// The GPU PolicyBackend against the CPU one across a weight update (gpu_backend_check.h).
TEST(GpuInferenceTest, GpuBackendMatchesTheCpuBackendAcrossAWeightUpdate) {
  SKIP_WITHOUT_GPU();
  rollout_check::BackendAcrossWeightUpdate(Device::Cuda(0), kF32.logits);
}

}  // namespace
}  // namespace orrery::model
