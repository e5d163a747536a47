// The GPU inference engine (model/gpu/gpu_inference.h) on CUDA against the host model's inference
// path (tests/gpu/gpu_inference_check.h: three slots over small pages with chunked and multi-turn
// prefill and batched decode, a forked prompt with copy-on-write, page accounting over many
// episodes, pool exhaustion), in the f32 debug mode and in bf16; then prefill + decode of a
// sequence of a few thousand tokens against the host's full forward of the same tokens, and the
// GPU PolicyBackend against the CPU one (LoadWeights keeps the caches). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <set>

#include "kernels/token_sampling.h"
#include "rollout/sampling.h"
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

// Decode calls that do not fill their bucket (padding rows) against the host; in bf16 the steps
// are replayed from CUDA graphs from each bucket's second use.
TEST(GpuInferenceTest, F32PaddedDecodeMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  inference_check::PaddedDecode(Device::Cuda(0), DType::kF32, kF32);
}
TEST(GpuInferenceTest, Bf16PaddedDecodeMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  inference_check::PaddedDecode(Device::Cuda(0), DType::kBF16, kBf16);
}

// A state per decode mode on one bf16 model, fed the same calls: prompts, then decode steps over
// changing sets of slots (buckets 6, 4, 2, 1, 3: captures and replays interleaved), contexts
// growing past page boundaries (pages of 8), a slot released and prefilled again, and sampled
// steps. Graph replays must equal the eager steps bit for bit (the same kernels on the same
// inputs: every op of the forward is deterministic); the general pass is compared to them within
// the bf16 tolerance over the first 15 steps (its KDA runs the chunked op, its transformed inputs
// rounded to bf16). Every page is back after the releases.
TEST(GpuInferenceTest, GraphReplaysEqualEagerStepsBitForBit) {
  SKIP_WITHOUT_GPU();
  auto host = inference_check::HostModel(1024);
  ASSERT_TRUE(host);
  auto gpu = inference_check::Upload(*host, Device::Cuda(0), DType::kBF16);
  ASSERT_TRUE(gpu);
  constexpr int64_t kSlots = 6;
  using Mode = GpuInferenceOptions::Decode;
  std::vector<std::unique_ptr<GpuInferenceState>> states;
  for (Mode mode : {Mode::kGraph, Mode::kEager, Mode::kPass}) {
    GpuInferenceOptions o;
    o.num_slots = kSlots;
    o.page_size = 8;
    o.max_tokens_per_slot = 512;
    o.decode = mode;
    auto st = GpuInferenceState::Create(gpu.get(), o);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    for (int64_t i = 0; i < kSlots; ++i) ASSERT_EQ(*(*st)->Allocate(), i);
    states.push_back(std::move(st).value());
  }
  const int64_t pages = states[0]->num_pages();
  std::vector<int64_t> all(kSlots);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < kSlots; ++i) prompts.push_back(inference_check::Tokens(5 + 7 * i, i));
  for (auto& st : states) ASSERT_TRUE(st->Prefill(all, prompts).ok());
  const std::vector<std::vector<int64_t>> calls = {all, {5, 1, 3, 0}, {2, 4}, {3}, {0, 2, 5}};
  inference_check::Stats pass_stats;
  for (int step = 0; step < 60; ++step) {
    if (step == 30) {
      for (auto& st : states) {
        ASSERT_TRUE(st->Release(4).ok());
        ASSERT_EQ(*st->Allocate(), 4);
        ASSERT_TRUE(st->Prefill({4}, {inference_check::Tokens(11, 77)}).ok());
      }
    }
    const std::vector<int64_t>& slots = calls[static_cast<size_t>(step) % calls.size()];
    const std::vector<int32_t> t =
        inference_check::Tokens(static_cast<int64_t>(slots.size()), 900 + step);
    StepOutput out[3];
    for (int m = 0; m < 3; ++m) {
      auto d = states[static_cast<size_t>(m)]->DecodeStep(slots, t);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      out[m] = std::move(d).value();
    }
    ASSERT_EQ(out[0].logits.shape(), out[1].logits.shape());
    ASSERT_EQ(
        std::memcmp(out[0].logits.raw_data(), out[1].logits.raw_data(), out[0].logits.nbytes()), 0)
        << "step " << step << ": graph and eager logits differ";
    ASSERT_EQ(std::memcmp(out[0].expert_ids.raw_data(), out[1].expert_ids.raw_data(),
                          out[0].expert_ids.nbytes()),
              0)
        << "step " << step;
    if (step < 15) {  // the bf16 check's length (as MultiSlot): routing flips accumulate
      inference_check::Compare(out[2], out[0], kBf16, "pass vs graph " + std::to_string(step),
                               &pass_stats, slots, std::vector<int64_t>(slots.size(), 1));
    }
  }
  // Sampled steps: the same draws give the same ids and log-probabilities on both.
  for (int step = 0; step < 10; ++step) {
    const std::vector<int64_t>& slots = calls[static_cast<size_t>(step) % calls.size()];
    std::vector<TokenDraw> draws;
    PhiloxGenerator rng(5, static_cast<uint64_t>(step));
    for (size_t i = 0; i < slots.size(); ++i) {
      draws.push_back({step % 3 == 0 ? 0.0 : 0.9, step % 2 == 0 ? 1.0 : 0.8, rng.Uniform()});
    }
    const std::vector<int32_t> t =
        inference_check::Tokens(static_cast<int64_t>(slots.size()), 990 + step);
    auto a = states[0]->DecodeAndSample(slots, t, draws);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = states[1]->DecodeAndSample(slots, t, draws);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(a->ids, b->ids) << "sampled step " << step;
    EXPECT_EQ(a->logprobs, b->logprobs) << "sampled step " << step;
    ASSERT_TRUE(states[2]->DecodeAndSample(slots, t, draws).ok());
  }
  const DecodeStats& g = states[0]->decode_stats();
  std::printf("graphs: %lld captures (%lld nodes), %lld replays, %lld eager steps%s%s\n",
              static_cast<long long>(g.graph_captures), static_cast<long long>(g.graph_nodes),
              static_cast<long long>(g.graph_replays), static_cast<long long>(g.eager_steps),
              g.graphs_off.empty() ? "" : "; off: ", g.graphs_off.c_str());
  inference_check::Report("general pass vs graphs", pass_stats, kBf16);
  EXPECT_TRUE(g.graphs_off.empty()) << g.graphs_off;
  EXPECT_GE(g.graph_captures, 5);
  EXPECT_GT(g.graph_replays, 40);
  EXPECT_EQ(states[1]->decode_stats().graph_replays, 0);
  EXPECT_EQ(states[2]->decode_stats().pass_steps, 70);
  for (auto& st : states) {
    for (int64_t i = 0; i < kSlots; ++i) ASSERT_TRUE(st->Release(i).ok());
    EXPECT_EQ(st->free_pages(), pages) << "a page leaked";
  }
}

// The device sampler (kernels::SampleTokens on CUDA) draws what rollout's SampleToken draws from
// the same logits and uniform numbers: spread, peaked, tied (quantised) and flat logits at a
// vocabulary the size of `small`'s, every temperature and nucleus kind. Ids equal; log-probs to
// 1e-5.
TEST(GpuInferenceTest, DeviceSamplingDrawsWhatSampleTokenDraws) {
  SKIP_WITHOUT_GPU();
  const int64_t v = 32768;
  PhiloxGenerator rng(8, 8);
  int64_t rows = 0;
  double worst = 0;
  for (int kind = 0; kind < 4; ++kind) {
    std::vector<float> z(static_cast<size_t>(v));
    for (auto& x : z) {
      const double n = rng.Normal();
      x = kind == 0   ? static_cast<float>(n)
          : kind == 1 ? static_cast<float>(10.0 * n)
          : kind == 2 ? static_cast<float>(std::round(2.0 * n) / 2.0)
                      : 0.5f;
    }
    std::vector<double> params;
    std::vector<rollout::SampledToken> want;
    for (double t : {0.0, 0.6, 1.0, 1.5}) {
      for (double top_p : {1.0, 0.99, 0.9, 0.3, 1e-9}) {
        for (int r = 0; r < 8; ++r) {
          const float u = r == 0 ? 0.0f : r == 7 ? 0.9999999f : rng.Uniform();
          params.insert(params.end(), {t, top_p, static_cast<double>(u)});
          want.push_back(rollout::SampleTokenWithUniform(z.data(), v, {t, top_p}, u));
        }
      }
    }
    const int64_t n = static_cast<int64_t>(want.size());
    Tensor logits = Tensor::Empty({n, v}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) std::copy(z.begin(), z.end(), logits.data<float>() + i * v);
    Tensor ids, logprobs;
    ASSERT_TRUE(kernels::SampleTokens(
                    logits.To(Device::Cuda(0)).value(),
                    Tensor::FromVector<double>({n, 3}, params).To(Device::Cuda(0)).value(), &ids,
                    &logprobs)
                    .ok());
    const Tensor ih = ids.To(Device::Cpu()).value(), lh = logprobs.To(Device::Cpu()).value();
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(ih.data<int32_t>()[i], want[static_cast<size_t>(i)].id)
          << "kind " << kind << " T " << params[i * 3] << " top_p " << params[i * 3 + 1] << " u "
          << params[i * 3 + 2];
      worst = std::max(worst, static_cast<double>(std::abs(lh.data<float>()[i] -
                                                           want[static_cast<size_t>(i)].logprob)));
    }
    rows += n;
  }
  std::printf("device sampling: %lld rows, worst log-prob difference %.3g\n",
              static_cast<long long>(rows), worst);
  EXPECT_LT(worst, 1e-5);
}

// A seed reproduces sampled episodes: two fresh states (graphs on) fed their own draws back for
// 40 steps from the same per-slot Philox streams draw the same tokens.
TEST(GpuInferenceTest, SampledDecodeIsReproducibleBySeed) {
  SKIP_WITHOUT_GPU();
  auto host = inference_check::HostModel(1024);
  ASSERT_TRUE(host);
  auto gpu = inference_check::Upload(*host, Device::Cuda(0), DType::kBF16);
  ASSERT_TRUE(gpu);
  auto run = [&]() -> std::vector<int32_t> {
    GpuInferenceOptions o;
    o.num_slots = 4;
    o.page_size = 16;
    o.max_tokens_per_slot = 256;
    auto st = GpuInferenceState::Create(gpu.get(), o);
    EXPECT_TRUE(st.ok());
    if (!st.ok()) return {};
    std::vector<int64_t> slots = {0, 1, 2, 3};
    std::vector<std::vector<int32_t>> prompts;
    std::vector<PhiloxGenerator> streams;
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(*(*st)->Allocate(), i);
      prompts.push_back(inference_check::Tokens(9, 50 + i));
      streams.emplace_back(123, static_cast<uint64_t>(i));
    }
    auto draws = [&] {
      std::vector<TokenDraw> d;
      for (auto& s : streams) d.push_back({0.8, 0.9, s.Uniform()});
      return d;
    };
    std::vector<int32_t> seq;
    auto first = (*st)->PrefillAndSample(slots, prompts, draws());
    EXPECT_TRUE(first.ok());
    if (!first.ok()) return {};
    std::vector<int32_t> last = first->ids;
    for (int step = 0; step < 40; ++step) {
      seq.insert(seq.end(), last.begin(), last.end());
      auto d = (*st)->DecodeAndSample(slots, last, draws());
      EXPECT_TRUE(d.ok()) << d.status().ToString();
      if (!d.ok()) return {};
      last = d->ids;
    }
    EXPECT_GT((*st)->decode_stats().graph_replays, 30);
    return seq;
  };
  const std::vector<int32_t> a = run(), b = run();
  ASSERT_EQ(a.size(), 160u);
  EXPECT_EQ(a, b);
  // Not a constant stream: the draws vary.
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 10u);
}

// The GPU PolicyBackend against the CPU one across a weight update (gpu_backend_check.h).
TEST(GpuInferenceTest, GpuBackendMatchesTheCpuBackendAcrossAWeightUpdate) {
  SKIP_WITHOUT_GPU();
  rollout_check::BackendAcrossWeightUpdate(Device::Cuda(0), kF32.logits);
}

}  // namespace
}  // namespace orrery::model
