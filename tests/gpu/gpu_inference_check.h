// The checks of the GPU inference engine (model/gpu/gpu_inference.h) against the host model's
// inference path (Model::Prefill / DecodeStep over model::InferenceState, itself checked against
// the full forward in tests/unit/model/inference_test.cc), shared by the unit test on the ops' CPU
// twins (tests/unit/model/gpu_inference_cpu_test.cc) and the GPU test
// (tests/gpu/gpu_inference_test.cc). Both sides start from the same host weights; tokens are
// fixed (not sampled) so a step feeds both the same input.
//
// The model has every layer kind (KDA with head size 64, the tensor-core path on CUDA; MLA through
// the q LoRA; a dense MLP and LatentMoE layers; Block AttnRes of two layers), two MLA layers so
// the page pools of several layers must agree, and conv_size 4 so the conv history matters.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/philox.h"
#include "model/config.h"
#include "model/gpu/gpu_inference.h"
#include "model/gpu/gpu_model.h"
#include "model/inference_state.h"
#include "model/model.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::model::inference_check {

// k3_mla_dims: MLA heads of K3's widths (qk 128 + 64, v 128; kv_lora_rank 64), which the
// tensor-core attention kernels take in bf16, instead of the toy 16 + 8 / 16. `vocab`: 131, or
// more for a chat tokenizer's ids (the agent-loop checks).
inline StatusOr<ModelConfig> Config(int64_t max_seq_len, bool k3_mla_dims = false,
                                    int64_t vocab = 131) {
  const std::string mla = k3_mla_dims ? R"(
kv_lora_rank = 64
qk_nope_head_dim = 128
qk_rope_head_dim = 64
v_head_dim = 128
)"
                                      : R"(
kv_lora_rank = 32
qk_nope_head_dim = 16
qk_rope_head_dim = 8
v_head_dim = 16
)";
  const std::string text = R"(
[model]
vocab_size = )" + std::to_string(vocab) +
                           R"(
hidden_size = 64
num_layers = 4
full_attn_layers = [2, 4]
first_k_dense = 1
dense_intermediate = 96
max_seq_len = )" + std::to_string(max_seq_len) +
                           R"(
[model.kda]
heads = 2
head_k_dim = 64
head_v_dim = 64
conv_size = 4
decay_rank = 16
chunk_size = 64
[model.mla]
heads = 2
q_lora_rank = 32)" + mla + R"([model.moe]
num_experts = 8
top_k = 2
num_shared_experts = 1
expert_intermediate = 32
shared_intermediate = 32
latent_dim = 32
[model.attn_res]
block_size = 2
)";
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseString(text, "infer.toml"));
  ConfigTable root = doc.root();
  StatusOr<ModelConfig> c = ReadModelConfig(root);
  ORRERY_RETURN_IF_ERROR(doc.Finish());
  return c;
}

// A host model with its parameters moved off their init (zero AttnRes queries, unit gains), so
// that every path of the stack matters.
inline std::unique_ptr<Model> HostModel(int64_t max_seq_len = 4096, bool k3_mla_dims = false,
                                        int64_t vocab = 131) {
  StatusOr<ModelConfig> c = Config(max_seq_len, k3_mla_dims, vocab);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  auto m = Model::Create(*c, 41, DType::kF32);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  PhiloxGenerator gen(19, 4);
  for (Parameter& p : (*m)->parameters()) {
    float* w = p.value.data<float>();
    for (int64_t i = 0; i < p.value.numel(); ++i) w[i] += static_cast<float>(0.05 * gen.Normal());
  }
  return std::move(m).value();
}

inline std::vector<int32_t> Tokens(int64_t len, uint64_t seed) {
  PhiloxGenerator gen(seed, 7);
  std::vector<int32_t> out(static_cast<size_t>(len));
  for (auto& t : out) t = static_cast<int32_t>(gen.UniformInt(131));
  return out;
}

// How close the GPU side must be: the relative RMS error of each call's logits against the
// host's, and the fraction of routed expert ids that may differ (0: all equal).
//
// `ids` bounds the fraction over the whole test (checked by Report), not per call: a decode call
// of the toy models routes only a few dozen ids. With `until_routing_differs` (bf16) a slot's
// logits row is compared only while every id of that slot so far agrees (slots are independent
// sequences, so one slot's flip says nothing of another's): bf16 rounding flips near-tied top-k
// choices, and one flipped expert of a two-layer toy model moves the logits by 10-15% relative
// (measured on the H200: 2 of 18 ids differing gave 0.138), which says nothing about the engine.
// The f32 runs, where every id agrees and the logits match to ~1e-6, are the exact check.
struct Tolerance {
  double logits = 0;
  double ids = 0;
  bool until_routing_differs = false;
};

struct Stats {
  double worst_logits = 0;
  int64_t ids = 0, ids_differing = 0;
  int64_t rows_checked = 0, rows_after_divergence = 0;
  std::set<int64_t> diverged_slots;
};

// One call over `slots` (call order) that appended `tokens[i]` tokens to slot i: logits row i is
// slots[i]'s, and its expert ids are the next tokens[i] rows of every layer.
inline void Compare(const StepOutput& host, const StepOutput& gpu, const Tolerance& tol,
                    const std::string& what, Stats* stats, const std::vector<int64_t>& slots,
                    const std::vector<int64_t>& tokens) {
  ASSERT_EQ(host.logits.shape(), gpu.logits.shape()) << what;
  ASSERT_EQ(gpu.logits.dtype(), DType::kF32) << what;
  ASSERT_EQ(host.expert_ids.shape(), gpu.expert_ids.shape()) << what;
  ASSERT_EQ(host.logits.dim(0), static_cast<int64_t>(slots.size())) << what;
  ASSERT_EQ(slots.size(), tokens.size()) << what;
  const int64_t layers = host.expert_ids.dim(0), n = host.expert_ids.dim(1);
  const int64_t k = host.expert_ids.dim(2);
  ASSERT_EQ(std::accumulate(tokens.begin(), tokens.end(), int64_t{0}), n) << what;
  const int32_t* h = host.expert_ids.data<int32_t>();
  const int32_t* g = gpu.expert_ids.data<int32_t>();
  int64_t row = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    int64_t differing = 0;
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t j = (l * n + row) * k; j < (l * n + row + tokens[i]) * k; ++j) {
        differing += h[j] != g[j];
      }
    }
    row += tokens[i];
    stats->ids += layers * tokens[i] * k;
    stats->ids_differing += differing;
    if (tol.until_routing_differs && (differing > 0 || stats->diverged_slots.count(slots[i]))) {
      stats->diverged_slots.insert(slots[i]);
      ++stats->rows_after_divergence;
      continue;
    }
    const int64_t r = static_cast<int64_t>(i);
    const double err = kernels::testing::RelRmsError(gpu.logits.Slice(r, r + 1).value(),
                                                     host.logits.Slice(r, r + 1).value());
    stats->worst_logits = std::max(stats->worst_logits, err);
    ++stats->rows_checked;
    EXPECT_LT(err, tol.logits) << what << ", slot " << slots[i];
  }
}

// A slot copied from another carries its history, divergence included.
inline void CopyDivergence(Stats* stats, int64_t from, int64_t to) {
  if (stats->diverged_slots.count(from)) stats->diverged_slots.insert(to);
}

// Prints the figures and checks the totals: the fraction of differing ids, and that some calls'
// logits were compared.
inline void Report(const char* name, const Stats& s, const Tolerance& tol) {
  std::printf(
      "%s: worst logits rel RMS %.3g over %lld slot rows (%lld after the slot's routing "
      "differed), expert ids differing %lld of %lld\n",
      name, s.worst_logits, static_cast<long long>(s.rows_checked),
      static_cast<long long>(s.rows_after_divergence), static_cast<long long>(s.ids_differing),
      static_cast<long long>(s.ids));
  EXPECT_GT(s.rows_checked, 0) << name << ": no logits row was compared";
  EXPECT_LE(static_cast<double>(s.ids_differing), tol.ids * static_cast<double>(s.ids))
      << name << ": " << s.ids_differing << " of " << s.ids << " expert ids differ";
}

inline std::unique_ptr<GpuModel> Upload(Model& host, Device device, DType dtype) {
  GpuModelOptions o;
  o.device = device;
  o.compute_dtype = dtype;
  auto g = GpuModel::FromHost(host, o);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(g).value() : nullptr;
}

// Three slots of different lengths in pages of 4 tokens (each slot's rows spread over several
// pages, interleaved with the other slots' as the batched decode steps take new pages): a prefill
// of 37, 5 and 20 tokens (the 37 in chunks of 16, prefill_chunk), six batched decode steps, a
// second turn of 9 and 3 tokens into slots 2 and 0 (multi-turn: the slots continue), then decode
// steps over all three and over a subset in another order.
// With mha_min_tokens > 0 (GpuInferenceOptions::mha_prefill_min_tokens; 0: the absorbed form
// only) feeds of that many tokens take the MHA form: at 8, the 37 (three chunks over one scratch)
// and the 20 beside the absorbed 5 in one call, then the second turn's 9 over slot 2's 26 cached
// tokens, decompressed from its pages; the count of MHA-form tokens is checked.
inline void MultiSlot(Device device, DType dtype, const Tolerance& tol,
                      int64_t mha_min_tokens = 0) {
  auto host = HostModel();
  ASSERT_TRUE(host);
  auto gpu = Upload(*host, device, dtype);
  ASSERT_TRUE(gpu);
  auto hs = InferenceState::Create(*host, InferenceOptions{3, 0});
  ASSERT_TRUE(hs.ok());
  GpuInferenceOptions go;
  go.num_slots = 3;
  go.page_size = 4;
  go.num_pages = 64;
  go.prefill_chunk = 16;
  go.mha_prefill_min_tokens = mha_min_tokens;
  auto gs = GpuInferenceState::Create(gpu.get(), go);
  ASSERT_TRUE(gs.ok()) << gs.status().ToString();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(*(*hs)->Allocate(), i);
    ASSERT_EQ(*(*gs)->Allocate(), i);
  }
  Stats stats;
  auto prefill = [&](const std::vector<int64_t>& slots,
                     const std::vector<std::vector<int32_t>>& feeds, const std::string& what) {
    auto h = host->Prefill(hs->get(), slots, feeds);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto g = (*gs)->Prefill(slots, feeds);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    std::vector<int64_t> lengths;
    for (const auto& f : feeds) lengths.push_back(static_cast<int64_t>(f.size()));
    Compare(*h, *g, tol, what, &stats, slots, lengths);
  };
  auto decode = [&](const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens,
                    const std::string& what) {
    auto h = host->DecodeStep(hs->get(), slots, tokens);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto g = (*gs)->DecodeStep(slots, tokens);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    Compare(*h, *g, tol, what, &stats, slots, std::vector<int64_t>(slots.size(), 1));
  };
  prefill({0, 1, 2}, {Tokens(37, 1), Tokens(5, 2), Tokens(20, 3)}, "prefill");
  if (::testing::Test::HasFatalFailure()) return;
  for (int step = 0; step < 6; ++step) {
    const std::vector<int32_t> t = Tokens(3, 100 + step);
    decode({0, 1, 2}, t, "decode " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) return;
  }
  prefill({2, 0}, {Tokens(9, 4), Tokens(3, 5)}, "second turn");
  if (::testing::Test::HasFatalFailure()) return;
  for (int step = 0; step < 5; ++step) {
    decode({1, 2, 0}, Tokens(3, 200 + step),
           "decode after the second turn " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) return;
  }
  decode({2, 1}, Tokens(2, 300), "decode of a subset");
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ((*gs)->length(s), (*hs)->length(s)) << s;
  int64_t mha = 0;
  for (int64_t m : {37, 5, 20, 9, 3}) mha += mha_min_tokens > 0 && m >= mha_min_tokens ? m : 0;
  EXPECT_EQ((*gs)->mha_prefill_tokens(), mha) << "tokens fed in the MHA form";
  Report("multi-slot", stats, tol);
}

// A shared prompt prefilled once and copied to two more slots (pages shared, none taken), then
// divergent continuations (the first decode copies the shared, partially filled last page for
// the two slots that still share it; the third writes in place): every step equals three
// separate prefills of the prompt on the host followed by the same continuations. Releasing the
// slots returns every page. With mha_min_tokens > 0 (as MultiSlot) at 7: the prompt and the
// branches' turns of 13 and 7 run in the MHA form, the latter over contexts in shared pages.
inline void Fork(Device device, DType dtype, const Tolerance& tol, int64_t mha_min_tokens = 0) {
  auto host = HostModel();
  ASSERT_TRUE(host);
  auto gpu = Upload(*host, device, dtype);
  ASSERT_TRUE(gpu);
  auto hs = InferenceState::Create(*host, InferenceOptions{3, 0});
  ASSERT_TRUE(hs.ok());
  GpuInferenceOptions go;
  go.num_slots = 3;
  go.page_size = 4;
  go.num_pages = 40;
  go.mha_prefill_min_tokens = mha_min_tokens;
  auto gs = GpuInferenceState::Create(gpu.get(), go);
  ASSERT_TRUE(gs.ok()) << gs.status().ToString();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(*(*hs)->Allocate(), i);
    ASSERT_EQ(*(*gs)->Allocate(), i);
  }
  const std::vector<int32_t> prompt = Tokens(10, 9);  // 3 pages, the last holding 2 rows
  Stats stats;
  auto h = host->Prefill(hs->get(), {0, 1, 2}, {prompt, prompt, prompt});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto g = (*gs)->Prefill({0}, {prompt});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  {
    // The host's first segment: logits row 0, expert ids of the first 10 tokens.
    StepOutput first;
    ASSERT_TRUE(h->logits.Slice(0, 1).ok());
    first.logits = h->logits.Slice(0, 1).value().Clone();
    const int64_t layers = h->expert_ids.dim(0), k = h->expert_ids.dim(2), n = h->expert_ids.dim(1);
    first.expert_ids = Tensor::Zeros({layers, 10, k}, DType::kI32);
    for (int64_t l = 0; l < layers; ++l) {
      std::copy_n(h->expert_ids.data<int32_t>() + l * n * k, 10 * k,
                  first.expert_ids.data<int32_t>() + l * 10 * k);
    }
    Compare(first, *g, tol, "shared prompt", &stats, {0}, {10});
  }
  const int64_t start = (*gs)->free_pages();
  EXPECT_EQ(start, 40 - 3);
  ASSERT_TRUE((*gs)->CopySlot(0, 1).ok());
  ASSERT_TRUE((*gs)->CopySlot(0, 2).ok());
  // The host prefilled the three separately: a flip in its slots 1 and 2 that slot 0 did not
  // have shows up in their first comparison below.
  CopyDivergence(&stats, 0, 1);
  CopyDivergence(&stats, 0, 2);
  EXPECT_EQ((*gs)->free_pages(), start) << "a copied slot shares its source's pages";
  EXPECT_EQ((*gs)->length(2), 10);
  for (int step = 0; step < 8; ++step) {
    const std::vector<int32_t> t = Tokens(3, 500 + step);  // different tokens per slot
    auto hd = host->DecodeStep(hs->get(), {0, 1, 2}, t);
    ASSERT_TRUE(hd.ok()) << hd.status().ToString();
    auto gd = (*gs)->DecodeStep({0, 1, 2}, t);
    ASSERT_TRUE(gd.ok()) << gd.status().ToString();
    Compare(*hd, *gd, tol, "divergent decode " + std::to_string(step), &stats, {0, 1, 2},
            {1, 1, 1});
    if (step == 0) {
      EXPECT_EQ((*gs)->free_pages(), start - 2) << "copy-on-write of the shared last page";
    }
  }
  // Tokens 10..17: pages 3 and 4 of each slot are its own; 0..1 still shared.
  EXPECT_EQ((*gs)->free_pages(), 40 - 2 - 3 * 3);
  // A second turn of different lengths on each branch.
  const std::vector<std::vector<int32_t>> turn = {Tokens(7, 11), Tokens(2, 12), Tokens(13, 13)};
  auto ht = host->Prefill(hs->get(), {2, 0, 1}, {turn[2], turn[0], turn[1]});
  ASSERT_TRUE(ht.ok()) << ht.status().ToString();
  auto gt = (*gs)->Prefill({2, 0, 1}, {turn[2], turn[0], turn[1]});
  ASSERT_TRUE(gt.ok()) << gt.status().ToString();
  Compare(*ht, *gt, tol, "second turn of the branches", &stats, {2, 0, 1}, {13, 7, 2});
  for (int64_t s = 0; s < 3; ++s) ASSERT_TRUE((*gs)->Release(s).ok());
  EXPECT_EQ((*gs)->free_pages(), 40) << "released slots return every page";
  int64_t mha = 0;
  for (int64_t m : {10, 7, 2, 13}) mha += mha_min_tokens > 0 && m >= mha_min_tokens ? m : 0;
  EXPECT_EQ((*gs)->mha_prefill_tokens(), mha) << "tokens fed in the MHA form";
  Report("fork", stats, tol);
}

// Episodes of random lengths joining, forking and leaving: after each round every page is back
// (the pool's free count returns to its start), and the slots' lengths are what was fed.
inline void PagesNeverLeak(Device device, DType dtype, int episodes) {
  auto host = HostModel();
  ASSERT_TRUE(host);
  auto gpu = Upload(*host, device, dtype);
  ASSERT_TRUE(gpu);
  GpuInferenceOptions go;
  go.num_slots = 4;
  go.page_size = 3;
  go.num_pages = 4 * 20;
  auto gs = GpuInferenceState::Create(gpu.get(), go);
  ASSERT_TRUE(gs.ok()) << gs.status().ToString();
  PhiloxGenerator gen(77, 1);
  for (int e = 0; e < episodes; ++e) {
    auto a = (*gs)->Allocate();
    ASSERT_TRUE(a.ok());
    const int64_t len = 1 + static_cast<int64_t>(gen.UniformInt(20));
    ASSERT_TRUE((*gs)->Prefill({*a}, {Tokens(len, 1000 + e)}).ok());
    std::vector<int64_t> slots = {*a};
    const int64_t forks = static_cast<int64_t>(gen.UniformInt(4));  // 0..3 more branches
    for (int64_t f = 0; f < forks; ++f) {
      auto b = (*gs)->Allocate();
      ASSERT_TRUE(b.ok());
      ASSERT_TRUE((*gs)->CopySlot(*a, *b).ok());
      slots.push_back(*b);
    }
    const int64_t steps = static_cast<int64_t>(gen.UniformInt(8));
    for (int64_t t = 0; t < steps; ++t) {
      auto d = (*gs)->DecodeStep(slots, Tokens(static_cast<int64_t>(slots.size()), 5000 + t));
      ASSERT_TRUE(d.ok()) << d.status().ToString();
    }
    for (int64_t s : slots) {
      EXPECT_EQ((*gs)->length(s), len + steps);
      ASSERT_TRUE((*gs)->Release(s).ok());
    }
    ASSERT_EQ((*gs)->free_pages(), go.num_pages) << "episode " << e;
    ASSERT_EQ((*gs)->num_free(), go.num_slots);
  }
}

// An empty pool is a ResourceExhausted error before anything changes, never a truncation.
inline void PoolExhaustion(Device device, DType dtype) {
  auto host = HostModel();
  ASSERT_TRUE(host);
  auto gpu = Upload(*host, device, dtype);
  ASSERT_TRUE(gpu);
  GpuInferenceOptions go;
  go.num_slots = 2;
  go.page_size = 4;
  go.num_pages = 4;
  auto gs = GpuInferenceState::Create(gpu.get(), go);
  ASSERT_TRUE(gs.ok()) << gs.status().ToString();
  const int64_t a = *(*gs)->Allocate(), b = *(*gs)->Allocate();
  auto too_long = (*gs)->Prefill({a}, {Tokens(17, 1)});
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_long.status().message().find("needs 5 latent pages, 4 of 4 are free"),
            std::string::npos)
      << too_long.status().message();
  EXPECT_EQ((*gs)->length(a), 0);
  EXPECT_EQ((*gs)->free_pages(), 4);
  ASSERT_TRUE((*gs)->Prefill({a}, {Tokens(12, 2)}).ok());
  ASSERT_TRUE((*gs)->Prefill({b}, {Tokens(4, 3)}).ok());
  EXPECT_EQ((*gs)->free_pages(), 0);
  // Both slots' pages are full: one more token each needs two pages.
  auto step = (*gs)->DecodeStep({a, b}, {1, 2});
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kResourceExhausted) << step.status().ToString();
  EXPECT_EQ((*gs)->length(a), 12);
  EXPECT_EQ((*gs)->length(b), 4);
  ASSERT_TRUE((*gs)->Release(b).ok());
  ASSERT_TRUE((*gs)->DecodeStep({a}, {1}).ok()) << "a page freed by a release is used again";
  EXPECT_EQ((*gs)->length(a), 13);
}

// Decode calls that do not fill their bucket (5 of 7 slots -> bucket 6, 7 -> 8, 2 -> 2): the
// fixed-shape step's padding rows (no KDA state, no latent written, attention over row 0 of page
// 0) must leave the real rows as the host computes them, across page boundaries (pages of 4) and a
// slot released and prefilled again in the middle.
inline void PaddedDecode(Device device, DType dtype, const Tolerance& tol) {
  auto host = HostModel();
  ASSERT_TRUE(host);
  auto gpu = Upload(*host, device, dtype);
  ASSERT_TRUE(gpu);
  constexpr int64_t kSlots = 7;
  auto hs = InferenceState::Create(*host, InferenceOptions{kSlots, 0});
  ASSERT_TRUE(hs.ok());
  GpuInferenceOptions go;
  go.num_slots = kSlots;
  go.page_size = 4;
  go.num_pages = 120;
  go.max_tokens_per_slot = 64;
  auto gs = GpuInferenceState::Create(gpu.get(), go);
  ASSERT_TRUE(gs.ok()) << gs.status().ToString();
  EXPECT_EQ((*gs)->DecodeBucket(5), 6);
  EXPECT_EQ((*gs)->DecodeBucket(7), 8);
  for (int64_t i = 0; i < kSlots; ++i) {
    ASSERT_EQ(*(*hs)->Allocate(), i);
    ASSERT_EQ(*(*gs)->Allocate(), i);
  }
  Stats stats;
  std::vector<int64_t> all(kSlots);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < kSlots; ++i) prompts.push_back(Tokens(3 + 2 * i, 40 + i));
  auto prefill = [&](const std::vector<int64_t>& slots,
                     const std::vector<std::vector<int32_t>>& feeds) {
    auto h = host->Prefill(hs->get(), slots, feeds);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto g = (*gs)->Prefill(slots, feeds);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    std::vector<int64_t> lengths;
    for (const auto& f : feeds) lengths.push_back(static_cast<int64_t>(f.size()));
    Compare(*h, *g, tol, "prefill", &stats, slots, lengths);
  };
  prefill(all, prompts);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<std::vector<int64_t>> calls = {all, {4, 0, 2, 6, 5}, {6, 1}, {1, 2, 3, 4, 5}};
  for (int step = 0; step < 12; ++step) {
    if (step == 6) {  // slot 3 leaves and a new episode takes it
      ASSERT_TRUE((*hs)->Release(3).ok());
      ASSERT_TRUE((*gs)->Release(3).ok());
      ASSERT_EQ(*(*hs)->Allocate(), 3);
      ASSERT_EQ(*(*gs)->Allocate(), 3);
      prefill({3}, {Tokens(6, 99)});
      if (::testing::Test::HasFatalFailure()) return;
    }
    const std::vector<int64_t>& slots = calls[static_cast<size_t>(step) % calls.size()];
    const std::vector<int32_t> t = Tokens(static_cast<int64_t>(slots.size()), 700 + step);
    auto h = host->DecodeStep(hs->get(), slots, t);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto g = (*gs)->DecodeStep(slots, t);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    Compare(*h, *g, tol, "padded decode " + std::to_string(step), &stats, slots,
            std::vector<int64_t>(slots.size(), 1));
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (int64_t s = 0; s < kSlots; ++s) {
    EXPECT_EQ((*gs)->length(s), (*hs)->length(s)) << s;
    ASSERT_TRUE((*gs)->Release(s).ok());
  }
  EXPECT_EQ((*gs)->free_pages(), go.num_pages) << "every page back after the releases";
  Report("padded decode", stats, tol);
}

}  // namespace orrery::model::inference_check
