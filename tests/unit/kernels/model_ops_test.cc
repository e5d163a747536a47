// The non-KDA ops against independent oracles: SiTU bounds and derivatives, causal attention vs a
// naive per-row softmax, AttnRes and cross-entropy gradients vs fp64 finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/philox.h"
#include "kernels/attn_res.h"
#include "kernels/cross_entropy.h"
#include "kernels/mla_attention.h"
#include "kernels/situ.h"

namespace orrery::kernels {
namespace {

std::vector<double> Randn(int64_t n, uint64_t seed) {
  PhiloxGenerator g(seed, 0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = g.Normal();
  return v;
}

TEST(SituTest, StaysWithinItsBounds) {
  GluActivation act;
  std::vector<double> a, u;
  for (double x = -200; x <= 200; x += 0.05) {
    a.push_back(x);
    u.push_back(-x * 1.7);
  }
  std::vector<double> h(a.size()), ones(a.size(), 1.0);
  GluForward(act, a.data(), ones.data(), static_cast<int64_t>(a.size()), h.data());
  double gmin = 1e9;
  for (size_t i = 0; i < h.size(); ++i) {
    // gate(a) * up(1) with up(1) = 25 tanh(1/25).
    const double gate = h[i] / (25.0 * std::tanh(1.0 / 25.0));
    gmin = std::min(gmin, gate);
    EXPECT_LE(gate, 4.0);  // the supremum; tanh and sigmoid round to 1 far out
  }
  EXPECT_GT(gmin, -0.2699);
  EXPECT_LT(gmin, -0.269);  // spec §5.3: the minimum is about -0.2698
  GluForward(act, a.data(), u.data(), static_cast<int64_t>(a.size()), h.data());
  for (double x : h) EXPECT_LE(std::abs(x), 100.0);  // beta * beta_lin, reached by rounding
}

TEST(SituTest, DerivativesMatchFiniteDifferences) {
  for (bool situ : {true, false}) {
    GluActivation act;
    act.situ = situ;
    const std::vector<double> a = Randn(50, 1), u = Randn(50, 2);
    std::vector<double> a3(a), u3(u);
    for (double& x : a3) x *= 3;
    for (double& x : u3) x *= 30;
    std::vector<double> dh(50, 1.0), da(50), du(50);
    GluBackward(act, a3.data(), u3.data(), dh.data(), 50, da.data(), du.data());
    for (int i = 0; i < 50; ++i) {
      auto f = [&](double x, double y) {
        double out;
        GluForward(act, &x, &y, 1, &out);
        return out;
      };
      const double e = 1e-6;
      EXPECT_NEAR(da[i], (f(a3[i] + e, u3[i]) - f(a3[i] - e, u3[i])) / (2 * e), 1e-7);
      EXPECT_NEAR(du[i], (f(a3[i], u3[i] + e) - f(a3[i], u3[i] - e)) / (2 * e), 1e-7);
    }
  }
}

TEST(CausalAttentionTest, MatchesNaiveSoftmaxAndFiniteDifferences) {
  const AttentionShape s{7, 2, 5, 3};
  const std::vector<int64_t> cu = {0, 4, 7};
  std::vector<double> q = Randn(7 * 2 * 5, 1), k = Randn(7 * 2 * 5, 2), v = Randn(7 * 2 * 3, 3);
  std::vector<double> o(7 * 2 * 3), lse(7 * 2);
  const double scale = 0.4;
  CausalAttentionForward(s, cu, scale, q.data(), k.data(), v.data(), o.data(), lse.data());
  // Naive oracle.
  for (int d = 0; d < 2; ++d) {
    for (int64_t i = cu[d]; i < cu[d + 1]; ++i) {
      for (int h = 0; h < 2; ++h) {
        std::vector<double> sc;
        double m = -1e300;
        for (int64_t j = cu[d]; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < 5; ++c) dot += q[(i * 2 + h) * 5 + c] * k[(j * 2 + h) * 5 + c];
          sc.push_back(dot * scale);
          m = std::max(m, dot * scale);
        }
        double z = 0;
        for (double x : sc) z += std::exp(x - m);
        for (int c = 0; c < 3; ++c) {
          double acc = 0;
          for (int64_t j = cu[d]; j <= i; ++j) {
            acc += std::exp(sc[j - cu[d]] - m) / z * v[(j * 2 + h) * 3 + c];
          }
          EXPECT_NEAR(o[(i * 2 + h) * 3 + c], acc, 1e-12);
        }
        EXPECT_NEAR(lse[i * 2 + h], m + std::log(z), 1e-12);
      }
    }
  }
  const std::vector<double> r = Randn(7 * 2 * 3, 9);
  auto loss = [&]() {
    std::vector<double> o2(o.size()), l2(lse.size());
    CausalAttentionForward(s, cu, scale, q.data(), k.data(), v.data(), o2.data(), l2.data());
    double t = 0;
    for (size_t i = 0; i < o2.size(); ++i) t += o2[i] * r[i];
    return t;
  };
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  CausalAttentionBackward(s, cu, scale, q.data(), k.data(), v.data(), o.data(), lse.data(),
                          r.data(), dq.data(), dk.data(), dv.data());
  for (auto [x, g] : {std::pair{&q, &dq}, std::pair{&k, &dk}, std::pair{&v, &dv}}) {
    for (size_t i = 0; i < x->size(); ++i) {
      const double old = (*x)[i], e = 1e-6;
      (*x)[i] = old + e;
      const double lp = loss();
      (*x)[i] = old - e;
      const double lm = loss();
      (*x)[i] = old;
      EXPECT_NEAR((*g)[i], (lp - lm) / (2 * e), 1e-7);
    }
  }
}

TEST(AttnResTest, GradientsMatchFiniteDifferences) {
  const int64_t rows = 3, d = 6, n = 3;
  std::vector<std::vector<double>> src = {Randn(rows * d, 1), Randn(rows * d, 2),
                                          Randn(rows * d, 3)};
  for (double& x : src[1]) x *= 10;  // sources of different scales
  std::vector<double> w = Randn(d, 4), g = Randn(d, 5), r = Randn(rows * d, 6);
  auto loss = [&]() {
    std::vector<const double*> s;
    for (auto& v : src) s.push_back(v.data());
    std::vector<double> h(rows * d);
    AttnResForward(s, rows, d, w.data(), g.data(), 1e-5, h.data(), static_cast<double*>(nullptr));
    double t = 0;
    for (int64_t i = 0; i < rows * d; ++i) t += h[i] * r[i];
    return t;
  };
  std::vector<const double*> s;
  for (auto& v : src) s.push_back(v.data());
  std::vector<double> h(rows * d), p(rows * n);
  AttnResForward(s, rows, d, w.data(), g.data(), 1e-5, h.data(), p.data());
  std::vector<std::vector<double>> ds(n, std::vector<double>(rows * d, 0.0));
  std::vector<double*> dsp;
  for (auto& v : ds) dsp.push_back(v.data());
  std::vector<double> dw(d, 0.0), dg(d, 0.0);
  AttnResBackward(s, rows, d, w.data(), g.data(), 1e-5, p.data(), r.data(), dsp, dw.data(),
                  dg.data());
  std::vector<std::pair<std::vector<double>*, std::vector<double>*>> checks = {
      {&w, &dw}, {&g, &dg}, {&src[0], &ds[0]}, {&src[1], &ds[1]}, {&src[2], &ds[2]}};
  for (auto [x, gr] : checks) {
    for (size_t i = 0; i < x->size(); ++i) {
      const double old = (*x)[i], e = 1e-6;
      (*x)[i] = old + e;
      const double lp = loss();
      (*x)[i] = old - e;
      const double lm = loss();
      (*x)[i] = old;
      EXPECT_NEAR((*gr)[i], (lp - lm) / (2 * e), 1e-6 * std::max(1.0, std::abs((*gr)[i])));
    }
  }
}

TEST(CrossEntropyTest, LossLogprobsEntropyAndGradients) {
  const int64_t n = 4, v = 5;
  Tensor logits = Tensor::FromVector<double>({n, v}, Randn(n * v, 3));
  Tensor targets = Tensor::FromVector<int32_t>({n}, {0, 4, 2, 1});
  Tensor mask = Tensor::FromVector<float>({n}, {1, 0, 1, 0.5});
  Tensor dlogits;
  StatusOr<double> loss = MaskedCrossEntropy(logits, targets, mask, &dlogits);
  ASSERT_TRUE(loss.ok());
  Tensor dlp = Tensor::FromVector<double>({n}, Randn(n, 4));
  Tensor dent = Tensor::FromVector<double>({n}, Randn(n, 5));
  Tensor dl2;
  ASSERT_TRUE(TokenLogprobsBackward(logits, targets, dlp, dent, &dl2).ok());
  auto objective = [&]() {
    Tensor lp, ent;
    EXPECT_TRUE(TokenLogprobs(logits, targets, &lp, &ent).ok());
    double t = 0;
    for (int64_t i = 0; i < n; ++i) {
      t += lp.data<double>()[i] * dlp.data<double>()[i] +
           ent.data<double>()[i] * dent.data<double>()[i];
    }
    return t;
  };
  for (int64_t i = 0; i < n * v; ++i) {
    double* x = logits.data<double>() + i;
    const double old = *x, e = 1e-6;
    *x = old + e;
    const double cp = *MaskedCrossEntropy(logits, targets, mask, nullptr), op = objective();
    *x = old - e;
    const double cm = *MaskedCrossEntropy(logits, targets, mask, nullptr), om = objective();
    *x = old;
    EXPECT_NEAR(dlogits.data<double>()[i], (cp - cm) / (2 * e), 1e-8);
    EXPECT_NEAR(dl2.data<double>()[i], (op - om) / (2 * e), 1e-8);
  }
  Tensor bad = Tensor::FromVector<int32_t>({n}, {0, 9, 2, 1});
  EXPECT_FALSE(MaskedCrossEntropy(logits, bad, Tensor(), nullptr).ok());
}

}  // namespace
}  // namespace orrery::kernels
