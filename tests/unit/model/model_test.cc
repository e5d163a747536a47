// Whole-model checks: fp64 finite differences for every parameter of a 2-layer model (KDA + MLA,
// dense + LatentMoE, AttnRes) and of a 4-layer one with AttnRes blocks of 2 layers and documents
// spanning several KDA chunks, forced routing replay, packed documents == documents alone.
#include "model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/philox.h"
#include "kernels/cross_entropy.h"

namespace orrery::model {
namespace {

// Two layers (KDA, MLA) with AttnRes blocks of one layer, or four (KDA, KDA, MLA, KDA) with
// blocks of two: then the intra-block partial sums and the block boundaries inside the stack are
// differentiated too.
StatusOr<ModelConfig> TinyConfig(int64_t gate_rank, bool recurrent, bool deep = false) {
  const std::string text = std::string(R"(
[model]
vocab_size = 11
hidden_size = 8
num_layers = )") + (deep ? "4\nfull_attn_layers = [3]" : "2\nfull_attn_layers = [2]") +
                           R"(
first_k_dense = 1
dense_intermediate = 6
[model.kda]
heads = 2
head_k_dim = 4
head_v_dim = 3
conv_size = 3
decay_rank = 4
chunk_size = 16
output_gate_rank = )" + std::to_string(gate_rank) +
                           R"(
algorithm = ")" + (recurrent ? "recurrent" : "chunked") +
                           R"("
[model.mla]
heads = 2
q_lora_rank = 4
kv_lora_rank = 6
qk_nope_head_dim = 4
qk_rope_head_dim = 2
v_head_dim = 3
[model.moe]
num_experts = 4
top_k = 2
num_shared_experts = 1
expert_intermediate = 5
shared_intermediate = 5
latent_dim = 6
routed_scaling_factor = 1.5
[model.attn_res]
block_size = )" + (deep ? "2" : "1") +
                           R"(
)";
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseString(text, "test.toml"));
  ConfigTable root = doc.root();
  StatusOr<ModelConfig> c = ReadModelConfig(root);
  ORRERY_RETURN_IF_ERROR(doc.Finish());
  return c;
}

Tensor Tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Tensor tok = Tensor::Empty({b, t}, DType::kI32);
  PhiloxGenerator gen(seed, 7);
  for (int64_t i = 0; i < tok.numel(); ++i) tok.data<int32_t>()[i] = gen.UniformInt(vocab);
  return tok;
}

// Moves every parameter away from its init (zero AttnRes queries, unit gains) so that each one
// has a non-trivial gradient.
void Perturb(Model& m, double scale) {
  PhiloxGenerator gen(99, 1);
  for (Parameter& p : m.parameters()) {
    double* w = p.value.data<double>();
    for (int64_t i = 0; i < p.value.numel(); ++i) w[i] += scale * gen.Normal();
  }
}

// L = sum(logits * R): dL/dlogits = R.
double Loss(const Tensor& logits, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < logits.numel(); ++i) s += logits.data<double>()[i] * r.data<double>()[i];
  return s;
}

// `deep`: the 4-layer model on one row of 40 tokens whose first document (37 tokens) spans three
// 16-token KDA chunks, so the chunked core's inter-chunk state passes are inside the check.
void CheckAllParameters(int64_t gate_rank, bool recurrent, bool deep = false) {
  StatusOr<ModelConfig> c = TinyConfig(gate_rank, recurrent, deep);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto model = Model::Create(*c, 5, DType::kF64);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Model& m = **model;
  Perturb(m, 0.3);
  Batch batch;
  if (deep) {
    batch.tokens = Tokens(1, 40, c->vocab_size, 3);
    batch.cu_seqlens = Tensor::FromVector<int64_t>({3}, {0, 37, 40});
  } else {
    batch.tokens = Tokens(2, 5, c->vocab_size, 3);
    batch.cu_seqlens = Tensor::FromVector<int64_t>({4}, {0, 3, 5, 10});
  }
  ForwardCache cache;
  StatusOr<Tensor> logits = m.Forward(batch, &cache);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  // Replay the routing so the loss is smooth under the finite-difference perturbations.
  batch.forced_experts = cache.StackedExpertIds();
  Tensor r = Tensor::Empty(logits->shape(), DType::kF64);
  PhiloxGenerator gen(4, 4);
  for (int64_t i = 0; i < r.numel(); ++i) r.data<double>()[i] = gen.Normal();
  m.ZeroGrad();
  ASSERT_TRUE(m.Backward(cache, r).ok());
  double worst = 0;
  std::string worst_name;
  for (Parameter& p : m.parameters()) {
    double* w = p.value.data<double>();
    const int64_t n = p.value.numel();
    // Up to 4 entries per tensor (every tensor is checked).
    for (int64_t s = 0; s < std::min<int64_t>(n, 4); ++s) {
      const int64_t i = (s * 7919 + 13) % n;
      // The deep model's loss has more curvature (four layers, 40 tokens): at h = 1e-5 the
      // central difference's own O(h^2) truncation error reached 6.5e-6 relative (input_norm),
      // and at h = 2e-6 it fell 25-fold to 2.6e-7 — the h^2 law, so the analytic gradient is
      // right; f64 round-off at this h stays near 1e-10.
      const double old = w[i], h = deep ? 2e-6 : 1e-5;
      w[i] = old + h;
      const double lp = Loss(*m.Forward(batch, nullptr), r);
      w[i] = old - h;
      const double lm = Loss(*m.Forward(batch, nullptr), r);
      w[i] = old;
      const double fd = (lp - lm) / (2 * h);
      const double an = p.grad.data<double>()[i];
      const double err = std::abs(fd - an) / std::max(1.0, std::abs(fd));
      if (err > worst) {
        worst = err;
        worst_name = p.name;
      }
      EXPECT_LT(err, 1e-6) << p.name << "[" << i << "]: fd " << fd << " analytic " << an;
    }
  }
  std::printf("max relative gradient error over %zu parameter tensors: %.3g (%s)\n",
              m.parameters().size(), worst, worst_name.c_str());
}

TEST(ModelGradientTest, EveryParameterMatchesFiniteDifferences) { CheckAllParameters(0, false); }
TEST(ModelGradientTest, LowRankGateAndRecurrentCore) { CheckAllParameters(3, true); }
TEST(ModelGradientTest, AttnResBlocksOfTwoAndDocumentsOverSeveralChunks) {
  CheckAllParameters(0, false, /*deep=*/true);
}

TEST(ModelTest, ForcedRoutingReproducesRecordedRouting) {
  StatusOr<ModelConfig> c = TinyConfig(0, false);
  ASSERT_TRUE(c.ok());
  auto model = Model::Create(*c, 1, DType::kF32);
  ASSERT_TRUE(model.ok());
  Batch batch;
  batch.tokens = Tokens(2, 7, c->vocab_size, 8);
  ForwardCache free_cache, forced_cache;
  StatusOr<Tensor> a = (*model)->Forward(batch, &free_cache);
  ASSERT_TRUE(a.ok());
  batch.forced_experts = free_cache.StackedExpertIds();
  StatusOr<Tensor> b = (*model)->Forward(batch, &forced_cache);
  ASSERT_TRUE(b.ok());
  for (int64_t i = 0; i < a->numel(); ++i) ASSERT_EQ(a->data<float>()[i], b->data<float>()[i]);
  const Tensor ids = forced_cache.StackedExpertIds();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ASSERT_EQ(ids.data<int32_t>()[i], batch.forced_experts.data<int32_t>()[i]);
  }
  // Out-of-range ids are one clear error.
  batch.forced_experts.data<int32_t>()[0] = 17;
  StatusOr<Tensor> bad = (*model)->Forward(batch, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("forced_experts"), std::string::npos);
}

TEST(ModelTest, RouterEntropyIsTheMeanEntropyOfNormalisedScores) {
  StatusOr<ModelConfig> c = TinyConfig(0, false);
  ASSERT_TRUE(c.ok());
  auto model = Model::Create(*c, 3, DType::kF32);
  ASSERT_TRUE(model.ok());
  Batch batch;
  batch.tokens = Tokens(2, 7, c->vocab_size, 11);
  ForwardCache cache;
  ASSERT_TRUE((*model)->Forward(batch, &cache).ok());
  BalancingMetrics metrics;
  ASSERT_TRUE((*model)->UpdateBalancingBiases({&cache}, &metrics).ok());
  ASSERT_EQ(metrics.router_entropy.size(), cache.router_scores().size());
  ASSERT_FALSE(metrics.router_entropy.empty());
  for (size_t l = 0; l < cache.router_scores().size(); ++l) {
    // Oracle: the definition, row by row, in long double.
    const Tensor& s = cache.router_scores()[l];
    const int64_t n = s.dim(0), e = s.dim(1);
    long double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      long double z = 0, h = 0;
      for (int64_t j = 0; j < e; ++j) z += s.data<float>()[i * e + j];
      for (int64_t j = 0; j < e; ++j) {
        const long double q = s.data<float>()[i * e + j] / z;
        h -= q * std::log(q);
      }
      total += h;
    }
    EXPECT_NEAR(metrics.router_entropy[l], static_cast<double>(total / n), 1e-9);
    EXPECT_GT(metrics.router_entropy[l], 0.0);
    EXPECT_LE(metrics.router_entropy[l], std::log(static_cast<double>(e)) + 1e-12);
  }
}

TEST(ModelTest, PackedRowEqualsDocumentsAlone) {
  StatusOr<ModelConfig> c = TinyConfig(0, false);
  ASSERT_TRUE(c.ok());
  auto model = Model::Create(*c, 2, DType::kF64);
  ASSERT_TRUE(model.ok());
  Perturb(**model, 0.1);
  Batch packed;
  packed.tokens = Tokens(1, 9, c->vocab_size, 5);
  packed.cu_seqlens = Tensor::FromVector<int64_t>({3}, {0, 4, 9});
  StatusOr<Tensor> all = (*model)->Forward(packed, nullptr);
  ASSERT_TRUE(all.ok());
  const int64_t v = c->vocab_size;
  const int64_t bounds[3] = {0, 4, 9};
  for (int doc = 0; doc < 2; ++doc) {
    const int64_t len = bounds[doc + 1] - bounds[doc];
    Batch one;
    one.tokens = Tensor::Empty({1, len}, DType::kI32);
    std::copy_n(packed.tokens.data<int32_t>() + bounds[doc], len, one.tokens.data<int32_t>());
    StatusOr<Tensor> alone = (*model)->Forward(one, nullptr);
    ASSERT_TRUE(alone.ok());
    for (int64_t i = 0; i < len * v; ++i) {
      ASSERT_NEAR(alone->data<double>()[i], all->data<double>()[bounds[doc] * v + i], 1e-12);
    }
  }
}

TEST(ModelTest, BadInputsAreOneClearError) {
  StatusOr<ModelConfig> c = TinyConfig(0, false);
  ASSERT_TRUE(c.ok());
  auto model = Model::Create(*c, 2, DType::kF32);
  ASSERT_TRUE(model.ok());
  Batch batch;
  batch.tokens = Tensor::FromVector<int32_t>({1, 3}, {1, 2, 11});
  EXPECT_NE((*model)->Forward(batch, nullptr).status().message().find("outside the vocabulary"),
            std::string::npos);
  batch.tokens = Tensor::FromVector<int32_t>({2, 2}, {1, 2, 3, 4});
  batch.cu_seqlens = Tensor::FromVector<int64_t>({3}, {0, 3, 4});
  EXPECT_NE((*model)->Forward(batch, nullptr).status().message().find("row start"),
            std::string::npos);
}

TEST(ModelTest, SaveLoadRoundTrip) {
  StatusOr<ModelConfig> c = TinyConfig(0, false);
  ASSERT_TRUE(c.ok());
  auto a = Model::Create(*c, 2, DType::kF32);
  auto b = Model::Create(*c, 3, DType::kF32);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->balancing_biases()[0].data<float>()[1] = 0.25f;
  const std::string path = ::testing::TempDir() + "/model_roundtrip.safetensors";
  ASSERT_TRUE((*a)->Save(path).ok());
  ASSERT_TRUE((*b)->Load(path).ok());
  Batch batch;
  batch.tokens = Tokens(1, 6, c->vocab_size, 1);
  StatusOr<Tensor> la = (*a)->Forward(batch, nullptr), lb = (*b)->Forward(batch, nullptr);
  for (int64_t i = 0; i < la->numel(); ++i) ASSERT_EQ(la->data<float>()[i], lb->data<float>()[i]);
}

TEST(ModelTest, CrossEntropyTrainsTheTinyModelDown) {
  StatusOr<ModelConfig> c = TinyConfig(0, false);
  ASSERT_TRUE(c.ok());
  auto model = Model::Create(*c, 2, DType::kF32);
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  Batch batch;
  batch.tokens = Tokens(2, 8, c->vocab_size, 2);
  Tensor targets = Tensor::Empty({16}, DType::kI32);
  for (int64_t i = 0; i < 16; ++i)
    targets.data<int32_t>()[i] = (batch.tokens.data<int32_t>()[i] + 1) % 11;
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    ForwardCache cache;
    StatusOr<Tensor> logits = m.Forward(batch, &cache);
    ASSERT_TRUE(logits.ok());
    Tensor dlogits;
    StatusOr<double> loss = kernels::MaskedCrossEntropy(*logits, targets, Tensor(), &dlogits);
    ASSERT_TRUE(loss.ok());
    if (step == 0) first = *loss;
    last = *loss;
    m.ZeroGrad();
    ASSERT_TRUE(m.Backward(cache, dlogits).ok());
    for (Parameter& p : m.parameters()) {
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        p.value.data<float>()[i] -= 0.05f * p.grad.data<float>()[i];
      }
    }
  }
  std::printf("tiny test model, 30 SGD steps: loss %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, first * 0.8);
}

}  // namespace
}  // namespace orrery::model
