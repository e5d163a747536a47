// The MoE ops' CPU twin (kernels/moe.h) against the CPU model's MoeLayer, and their backward
// against f64 finite differences.
//
// MoeLayer with latent_dim = 0, no latent norm and no shared expert is exactly router -> top-k ->
// experts' weighted sum, so the ops composed as the GPU model composes them (RouteTopK on the
// layer's scores, MoeExperts, then MoeExpertsGrad, RouteTopKGrad and the router product) must
// give the layer's ids and weights bit for bit (the same operations in the same order) and its
// output and every gradient to rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/philox.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/moe_balancing.h"
#include "model/layers.h"
#include "model/quantile_balancing.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using model::Parameter;
using testing::RandomNormal;
using testing::RelRmsError;

// The layer's per-expert [r, c] parameters (value or grad) stacked into one [E, r, c] tensor.
Tensor Stack(const std::vector<Parameter>& params, const std::string& prefix, const char* name,
             bool grad) {
  std::vector<const Tensor*> parts;
  for (const Parameter& p : params) {
    if (p.name.rfind(prefix, 0) == 0 && p.name.size() > std::strlen(name) &&
        p.name.compare(p.name.size() - std::strlen(name), std::strlen(name), name) == 0) {
      parts.push_back(grad ? &p.grad : &p.value);
    }
  }
  const Tensor& first = *parts[0];
  Tensor out = Tensor::Empty({static_cast<int64_t>(parts.size()), first.dim(0), first.dim(1)},
                             first.dtype());
  for (size_t e = 0; e < parts.size(); ++e) {
    std::memcpy(static_cast<char*>(out.raw_data()) + e * first.nbytes(), parts[e]->raw_data(),
                first.nbytes());
  }
  return out;
}

const Parameter& Find(const std::vector<Parameter>& params, const std::string& name) {
  for (const Parameter& p : params) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no parameter " << name;
  return params[0];
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Forced routing onto the first min(E, 2k) experts: expert 3 in slot 0 of every token (it receives
// all of them), the others drawn distinct from the pool, so the experts past it get none.
std::vector<int32_t> ForcedIds(int64_t n, int64_t e, int64_t k, PhiloxGenerator& rng) {
  const int64_t pool = std::min(e, 2 * k);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {
    ids[t * k] = 3;
    for (int64_t j = 1; j < k; ++j) {
      int32_t id;
      bool repeat;
      do {
        id = static_cast<int32_t>(rng.NextU32() % pool);
        repeat = false;
        for (int64_t jj = 0; jj < j; ++jj) repeat |= ids[t * k + jj] == id;
      } while (repeat);
      ids[t * k + j] = id;
    }
  }
  return ids;
}

using LayerCase = std::tuple<DType, int64_t, int64_t, bool>;  // dtype, E, k, forced
class MoeOpsVsLayerTest : public ::testing::TestWithParam<LayerCase> {};

template <typename T>
void CompareWithLayer(int64_t e, int64_t k, bool forced, double tol) {
  model::ModelConfig c;
  c.hidden_size = 24;
  c.moe.num_experts = e;
  c.moe.top_k = k;
  c.moe.expert_intermediate = 16;
  c.moe.num_shared_experts = 0;
  c.moe.latent_dim = 0;
  c.moe.latent_norm = false;
  c.moe.routed_scaling_factor = 2.5;
  const DType dt = DTypeOf<T>::value;
  std::vector<Parameter> params;
  model::ParamStore store(&params, 7, dt, &c);
  const model::MoeLayer<T> layer(store, c, "moe");
  const int64_t n = 37, d = c.hidden_size;
  PhiloxGenerator rng(11 + e + k + forced, 0);
  const Tensor x = RandomNormal({n, d}, dt, rng);
  const Tensor bias = RandomNormal({e}, DType::kF32, rng, 0.1);
  const Tensor forced_ids =
      forced ? Tensor::FromVector<int32_t>({n, k}, ForcedIds(n, e, k, rng)) : Tensor();
  typename model::MoeLayer<T>::Cache cache;
  Tensor y_layer = Tensor::Zeros({n, d}, dt);
  ASSERT_TRUE(layer
                  .Forward(x.data<T>(), n, forced ? forced_ids.data<int32_t>() : nullptr,
                           bias.data<float>(), y_layer.data<T>(), &cache)
                  .ok());

  Tensor ids, weights;
  Status st =
      RouteTopK(cache.scores, bias, forced_ids, k, c.moe.routed_scaling_factor, &ids, &weights);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(SameBytes(ids, cache.ids)) << "ids";
  EXPECT_TRUE(SameBytes(weights, cache.weights)) << "weights";

  const Tensor w1 = Stack(params, "moe.experts.", ".w1", false);
  const Tensor w3 = Stack(params, "moe.experts.", ".w3", false);
  const Tensor w2 = Stack(params, "moe.experts.", ".w2", false);
  const GluActivation act = model::ActivationOf(c);
  Tensor y;
  MoeExpertsSaved saved;
  st = MoeExperts(x, ids, weights, w1, w3, w2, act, &y, &saved);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_LE(RelRmsError(y, y_layer), tol) << "y";
  if (forced) {
    EXPECT_EQ(saved.offsets[4] - saved.offsets[3], n) << "expert 3 has every token";
    if (2 * k < e) {
      EXPECT_EQ(saved.offsets[e] - saved.offsets[2 * k], 0) << "experts >= 2k: none";
    }
  }

  const Tensor dy = RandomNormal({n, d}, dt, rng);
  Tensor dx_layer = Tensor::Zeros({n, d}, dt);
  layer.Backward(x.data<T>(), n, cache, dy.data<T>(), dx_layer.data<T>());
  Tensor dxl, dweights, dw1, dw3, dw2, dlogits;
  st = MoeExpertsGrad(x, ids, weights, w1, w3, w2, act, saved, dy, &dxl, &dweights, &dw1, &dw3,
                      &dw2);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = RouteTopKGrad(cache.scores, ids, dweights, c.moe.routed_scaling_factor, &dlogits);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The router product the GPU model runs after RouteTopKGrad.
  const Tensor& router = Find(params, "moe.router").value;
  ASSERT_TRUE(Matmul(dlogits, router, {false, false, 1.0f, 1.0f}, &dxl).ok());
  Tensor drouter;
  ASSERT_TRUE(Matmul(dlogits, x, {true, false, 1.0f, 0.0f}, &drouter).ok());
  EXPECT_LE(RelRmsError(dxl, dx_layer), tol) << "dx";
  EXPECT_LE(RelRmsError(drouter, Find(params, "moe.router").grad), tol) << "router grad";
  EXPECT_LE(RelRmsError(dw1, Stack(params, "moe.experts.", ".w1", true)), tol) << "dw1";
  EXPECT_LE(RelRmsError(dw3, Stack(params, "moe.experts.", ".w3", true)), tol) << "dw3";
  EXPECT_LE(RelRmsError(dw2, Stack(params, "moe.experts.", ".w2", true)), tol) << "dw2";
}

TEST_P(MoeOpsVsLayerTest, RoutingIsExactAndEverythingElseMatchesToRounding) {
  const auto [dt, e, k, forced] = GetParam();
  // The same products on the same rows in the same order: in practice identical; the bounds
  // allow for a BLAS that blocks an expert's rows differently from the layer's whole-expert call.
  if (dt == DType::kF64) {
    CompareWithLayer<double>(e, k, forced, 1e-13);
  } else {
    CompareWithLayer<float>(e, k, forced, 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(All, MoeOpsVsLayerTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF64),
                                            ::testing::Values(int64_t{8}, int64_t{64}),
                                            ::testing::Values(int64_t{2}, int64_t{8}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(DTypeName(std::get<0>(info.param))) + "_E" +
                                  std::to_string(std::get<1>(info.param)) + "_k" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "_forced" : "");
                         });

// Scores and biases on a grid of quarters: s + b ties between many experts of one row.
TEST(RouteTopKTest, TiesAndBiasFollowSelectTopK) {
  const int64_t n = 200, e = 16, k = 5;
  PhiloxGenerator rng(21, 0);
  std::vector<float> s(n * e), b(e);
  for (float& v : s) v = 0.25f * static_cast<float>(1 + rng.NextU32() % 3);
  for (float& v : b) v = 0.25f * static_cast<float>(rng.NextU32() % 2);
  const Tensor scores = Tensor::FromVector<float>({n, e}, s);
  const Tensor bias = Tensor::FromVector<float>({e}, b);
  for (const Tensor& bb : {Tensor(), bias}) {
    Tensor ids, weights;
    ASSERT_TRUE(RouteTopK(scores, bb, Tensor(), k, 1.0, &ids, &weights).ok());
    std::vector<int32_t> want(n * k);
    model::SelectTopK(s.data(), bb.defined() ? b.data() : nullptr, n, e, k, want.data());
    EXPECT_EQ(std::memcmp(ids.raw_data(), want.data(), want.size() * sizeof(int32_t)), 0);
    for (int64_t t = 0; t < n; ++t) {  // renormalised: each row sums to rho = 1
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += weights.data<float>()[t * k + j];
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
}

// Central differences of L = sum_p c_p weights_p with the selection held (forced = the ids).
TEST(RouteTopKGradTest, MatchesFiniteDifferencesThroughTheSigmoid) {
  const int64_t n = 6, e = 9, k = 3;
  const double rho = 1.7, h = 1e-6;
  PhiloxGenerator rng(31, 0);
  const Tensor logits = RandomNormal({n, e}, DType::kF64, rng);
  const Tensor c = RandomNormal({n, k}, DType::kF64, rng);
  auto scores_of = [&](const Tensor& z) {
    Tensor s = z.Clone();
    for (int64_t i = 0; i < s.numel(); ++i) {
      s.data<double>()[i] = 1.0 / (1.0 + std::exp(-z.data<double>()[i]));
    }
    return s;
  };
  Tensor ids, weights;
  ASSERT_TRUE(RouteTopK(scores_of(logits), Tensor(), Tensor(), k, rho, &ids, &weights).ok());
  auto loss = [&](const Tensor& z) {
    Tensor i2, w;
    EXPECT_TRUE(RouteTopK(scores_of(z), Tensor(), ids, k, rho, &i2, &w).ok());
    double l = 0;
    for (int64_t p = 0; p < n * k; ++p) l += c.data<double>()[p] * w.data<double>()[p];
    return l;
  };
  Tensor dlogits;
  ASSERT_TRUE(RouteTopKGrad(scores_of(logits), ids, c, rho, &dlogits).ok());
  for (int64_t i = 0; i < n * e; ++i) {
    Tensor zp = logits.Clone(), zm = logits.Clone();
    zp.data<double>()[i] += h;
    zm.data<double>()[i] -= h;
    EXPECT_NEAR(dlogits.data<double>()[i], (loss(zp) - loss(zm)) / (2 * h), 1e-8) << i;
  }
}

class MoeExpertsFiniteDifferenceTest : public ::testing::TestWithParam<bool> {};

// L = sum dy * y; every entry of every gradient against central differences in f64.
TEST_P(MoeExpertsFiniteDifferenceTest, EveryGradientMatches) {
  const int64_t n = 5, e = 4, k = 2, l = 6, f = 5;
  const double h = 1e-6;
  GluActivation act;
  act.situ = GetParam();
  act.beta = 1.5;  // tight caps, so the tanh terms of SiTU bend within the inputs' range
  act.beta_lin = 2.0;
  PhiloxGenerator rng(41 + act.situ, 0);
  Tensor xl = RandomNormal({n, l}, DType::kF64, rng);
  Tensor weights = RandomNormal({n, k}, DType::kF64, rng);
  Tensor w1 = RandomNormal({e, f, l}, DType::kF64, rng, 0.6);
  Tensor w3 = RandomNormal({e, f, l}, DType::kF64, rng, 0.6);
  Tensor w2 = RandomNormal({e, l, f}, DType::kF64, rng, 0.6);
  const Tensor dy = RandomNormal({n, l}, DType::kF64, rng);
  // Expert 3 unused, expert 0 in every token: empty and full experts in one call.
  const Tensor ids =
      Tensor::FromVector<int32_t>({n, k}, std::vector<int32_t>{0, 1, 2, 0, 0, 2, 1, 0, 0, 2});
  auto loss = [&]() {
    Tensor y;
    EXPECT_TRUE(MoeExperts(xl, ids, weights, w1, w3, w2, act, &y, nullptr).ok());
    double sum = 0;
    for (int64_t i = 0; i < y.numel(); ++i) sum += dy.data<double>()[i] * y.data<double>()[i];
    return sum;
  };
  Tensor y;
  MoeExpertsSaved saved;
  ASSERT_TRUE(MoeExperts(xl, ids, weights, w1, w3, w2, act, &y, &saved).ok());
  EXPECT_EQ(saved.offsets, (std::vector<int64_t>{0, 5, 7, 10, 10}));
  // Stable: within an expert the rows follow p = token * k + slot; rank inverts perm.
  EXPECT_EQ(std::vector<int32_t>(saved.perm.data<int32_t>(), saved.perm.data<int32_t>() + n * k),
            (std::vector<int32_t>{0, 3, 4, 7, 8, 1, 6, 2, 5, 9}));
  for (int64_t r = 0; r < n * k; ++r) {
    EXPECT_EQ(saved.rank.data<int32_t>()[saved.perm.data<int32_t>()[r]], r);
  }
  Tensor dxl = Tensor::Zeros({n, l}, DType::kF64), dweights, dw1, dw3, dw2;
  const Status st = MoeExpertsGrad(xl, ids, weights, w1, w3, w2, act, saved, dy, &dxl, &dweights,
                                   &dw1, &dw3, &dw2);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::vector<std::tuple<const char*, Tensor*, const Tensor*>> checks = {
      {"xl", &xl, &dxl},
      {"weights", &weights, &dweights},
      {"w1", &w1, &dw1},
      {"w3", &w3, &dw3},
      {"w2", &w2, &dw2}};
  for (const auto& [name, param, grad] : checks) {
    for (int64_t i = 0; i < param->numel(); ++i) {
      double& v = param->data<double>()[i];
      const double v0 = v;
      v = v0 + h;
      const double lp = loss();
      v = v0 - h;
      const double lm = loss();
      v = v0;
      EXPECT_NEAR(grad->data<double>()[i], (lp - lm) / (2 * h), 1e-7) << name << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SituAndSilu, MoeExpertsFiniteDifferenceTest, ::testing::Bool());

// QuantileThresholds' c_j, applied as QuantileBalancingStep applies them (b - eta c, re-centred),
// give that step's biases bit for bit, in both forms; scores on a grid of quarters tie often.
TEST(QuantileThresholdsTest, GiveQuantileBalancingStepsBiases) {
  for (const auto& [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{333, 8, 2}, {1000, 64, 8}, {1, 8, 2}, {50, 16, 15}}) {
    for (const model::Balancing form :
         {model::Balancing::kQuantileCutoff, model::Balancing::kQuantileExclusive}) {
      PhiloxGenerator rng(61 + m + n + k, 0);
      std::vector<float> s(m * n), b(n);
      for (int64_t i = 0; i < m * n; ++i) {
        s[i] = i % 3 == 0 ? 0.25f * static_cast<float>(1 + rng.NextU32() % 3)
                          : static_cast<float>(1.0 / (1.0 + std::exp(-rng.Normal())));
      }
      for (float& v : b) v = static_cast<float>(0.1 * rng.Normal());
      const Tensor scores = Tensor::FromVector<float>({m, n}, s);
      Tensor bias = Tensor::FromVector<float>({n}, b);
      Tensor c;
      const Status st =
          QuantileThresholds(scores, bias, k, form == model::Balancing::kQuantileExclusive, &c);
      ASSERT_TRUE(st.ok()) << st.ToString();
      model::MoeConfig config;
      config.num_experts = n;
      config.top_k = k;
      config.balancing = form;
      config.balancing_step = 0.5;
      model::QuantileBalancingResult result;
      ASSERT_TRUE(model::QuantileBalancingStep({&scores}, config, &bias, &result).ok());
      double mean = 0;
      for (int64_t j = 0; j < n; ++j) mean += b[j] - config.balancing_step * c.data<double>()[j];
      mean /= static_cast<double>(n);
      for (int64_t j = 0; j < n; ++j) {
        const float want =
            static_cast<float>(b[j] - config.balancing_step * c.data<double>()[j] - mean);
        EXPECT_EQ(bias.data<float>()[j], want) << "m " << m << " n " << n << " expert " << j;
      }
    }
  }
}

// Each bad call is one InvalidArgument line naming the op and what was expected.
TEST(MoeOpsErrorsTest, BadArgumentsAreOneClearLine) {
  const int64_t n = 3, e = 8, k = 2, l = 4, f = 3;
  PhiloxGenerator rng(51, 0);
  const Tensor scores = RandomNormal({n, e}, DType::kF32, rng);
  Tensor ids, weights;
  auto expect = [](const Status& st, const std::string& message) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message(), message);
  };
  auto forced = [&](std::vector<int32_t> v) { return Tensor::FromVector<int32_t>({n, k}, v); };
  expect(RouteTopK(scores, Tensor(), forced({0, 1, 2, 9, 4, 5}), k, 1.0, &ids, &weights),
         "forced_experts: expert id 9 at token 1 is outside [0, 8)");
  expect(RouteTopK(scores, Tensor(), forced({0, 1, 2, 3, 4, 4}), k, 1.0, &ids, &weights),
         "forced_experts: expert 4 repeated at token 2");
  expect(RouteTopK(scores, Tensor(), Tensor(), 9, 1.0, &ids, &weights),
         "route_topk: top_k 9, expected 1 to 8 (min(E = 8, 16))");
  expect(RouteTopK(scores, Tensor::Zeros({e}, DType::kF64), Tensor(), k, 1.0, &ids, &weights),
         "route_topk: bias f64[8] on cpu, expected f32[8] on cpu");
  const Tensor xl = RandomNormal({n, l}, DType::kF32, rng);
  const Tensor w1 = RandomNormal({e, f, l}, DType::kF32, rng);
  const Tensor w2 = RandomNormal({e, l, f}, DType::kF32, rng);
  const Tensor w = RandomNormal({n, k}, DType::kF32, rng);
  Tensor y;
  expect(MoeExperts(xl, forced({0, 1, 8, 3, 4, 5}), w, w1, w1, w2, {}, &y, nullptr),
         "moe_experts: ids[1, 0] = 8, expected [0, 8)");
  expect(MoeExperts(xl, forced({0, 1, 2, 3, 4, 5}), w, w1, w1, w1, {}, &y, nullptr),
         "moe_experts: w2 f32[8, 3, 4] on cpu, expected f32[8, 4, 3] on cpu");
  // Quantile Balancing's statistics: thresholds need a row, margins take none.
  const Tensor bias = Tensor::Zeros({e}, DType::kF32);
  Tensor stat;
  expect(QuantileThresholds(Tensor::Zeros({0, e}, DType::kF32), bias, k, false, &stat),
         "quantile_thresholds: scores f32[0, 8] on cpu, expected f32 [m >= 1, n] with 2 <= n <= "
         "1024");
  EXPECT_TRUE(QuantileMargins(Tensor::Zeros({0, e}, DType::kF32), bias, k, false, &stat).ok());
  expect(QuantileMargins(Tensor::Zeros({n, 1}, DType::kF32), bias, k, false, &stat),
         "quantile_margins: scores f32[3, 1] on cpu, expected f32 [m, n] with 2 <= n <= 1024");
  expect(QuantileMargins(scores, bias, e, true, &stat),
         "quantile_margins: top_k 8, expected 1 to min(n - 1 = 7, 16)");
  expect(QuantileThresholds(scores, Tensor::Zeros({e + 1}, DType::kF32), k, false, &stat),
         "quantile_thresholds: bias f32[9] on cpu, expected f32[8] on cpu");
}

}  // namespace
}  // namespace orrery::kernels
