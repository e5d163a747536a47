// KDA gate (both kinds) and q/k L2 norm: forward values and backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kernels/kda.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::RandomNormal;

// Checks d(sum(f(x) * w))/dx of every element of x by central differences.
void CheckFd(Tensor x, const std::function<double(const Tensor&)>& loss, const Tensor& analytic,
             const char* name) {
  ASSERT_TRUE(analytic.defined()) << name;
  double worst = 0;
  for (int64_t j = 0; j < x.numel(); ++j) {
    double* p = x.data<double>();
    const double saved = p[j], eps = 1e-6;
    p[j] = saved + eps;
    const double lp = loss(x);
    p[j] = saved - eps;
    const double lm = loss(x);
    p[j] = saved;
    const double fd = (lp - lm) / (2 * eps);
    worst = std::max(worst, std::abs(analytic.data<double>()[j] - fd) / (1 + std::abs(fd)));
  }
  // Central differences in f64 at eps = 1e-6: error ~1e-10.
  EXPECT_LT(worst, 1e-7) << name;
}

double Dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

class KdaGateTest : public ::testing::TestWithParam<std::tuple<KdaGateKind, bool>> {};

TEST_P(KdaGateTest, BackwardMatchesFiniteDifferences) {
  const auto [kind, with_params] = GetParam();
  PhiloxGenerator rng(4, 0);
  const Tensor z = RandomNormal({3, 2, 5}, DType::kF64, rng, 2.0);
  const Tensor a_log = with_params ? RandomNormal({2}, DType::kF64, rng, 0.5) : Tensor();
  const Tensor dt_bias = with_params ? RandomNormal({10}, DType::kF64, rng) : Tensor();
  const Tensor w = RandomNormal({3, 2, 5}, DType::kF64, rng);
  const float g_min = -5.0f;
  auto loss = [&](const Tensor& zz, const Tensor& aa, const Tensor& bb) {
    Tensor g;
    EXPECT_TRUE(KdaGateForward(zz, aa, bb, kind, g_min, &g).ok());
    return Dot(g, w);
  };
  Tensor dz, da, db;
  ASSERT_TRUE(KdaGateBackward(z, a_log, dt_bias, kind, g_min, w, &dz, &da, &db).ok());
  CheckFd(
      z.Clone(), [&](const Tensor& x) { return loss(x, a_log, dt_bias); }, dz, "z");
  if (with_params) {
    CheckFd(
        a_log.Clone(), [&](const Tensor& x) { return loss(z, x, dt_bias); }, da, "a_log");
    CheckFd(
        dt_bias.Clone(), [&](const Tensor& x) { return loss(z, a_log, x); }, db, "dt_bias");
  } else {
    EXPECT_FALSE(da.defined());
    EXPECT_FALSE(db.defined());
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, KdaGateTest,
                         ::testing::Combine(::testing::Values(KdaGateKind::kBounded,
                                                              KdaGateKind::kOriginal),
                                            ::testing::Bool()));

TEST(KdaGate, ForwardValuesAndBounds) {
  const Tensor z = Tensor::FromVector<double>({1, 1, 3}, {-30.0, 0.0, 30.0});
  const Tensor a_log = Tensor::FromVector<double>({1}, {std::log(2.0)});
  Tensor g;
  ASSERT_TRUE(KdaGateForward(z, a_log, Tensor(), KdaGateKind::kBounded, -5.0f, &g).ok());
  // g = -5 sigmoid(2 z): -> 0 as z -> -inf (no decay), -2.5 at 0, -> -5 as z -> +inf.
  EXPECT_NEAR(g.data<double>()[0], 0.0, 1e-12);
  EXPECT_LT(g.data<double>()[0], 0.0);
  EXPECT_DOUBLE_EQ(g.data<double>()[1], -2.5);
  EXPECT_NEAR(g.data<double>()[2], -5.0, 1e-12);
  ASSERT_TRUE(KdaGateForward(z, a_log, Tensor(), KdaGateKind::kOriginal, -5.0f, &g).ok());
  // g = -2 softplus(z): softplus(0) = ln 2; softplus(30) = 30 + log1p(e^-30).
  EXPECT_NEAR(g.data<double>()[0], -2.0 * std::log1p(std::exp(-30.0)), 1e-20);
  EXPECT_DOUBLE_EQ(g.data<double>()[1], -2.0 * std::log(2.0));
  EXPECT_NEAR(g.data<double>()[2], -60.0, 1e-12);
}

TEST(KdaGate, RejectsBadArguments) {
  const Tensor z = Tensor::Zeros({4, 2, 8}, DType::kF64);
  Tensor g;
  Status s = KdaGateForward(z, Tensor::Zeros({3}, DType::kF64), Tensor(), KdaGateKind::kBounded,
                            -5.0f, &g);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a_log f64[3]"), std::string::npos) << s.message();
  s = KdaGateForward(z, Tensor(), Tensor::Zeros({8}, DType::kF64), KdaGateKind::kBounded, -5.0f,
                     &g);
  EXPECT_NE(s.message().find("dt_bias"), std::string::npos) << s.message();
  s = KdaGateForward(z, Tensor(), Tensor(), KdaGateKind::kBounded, 0.5f, &g);
  EXPECT_NE(s.message().find("g_min"), std::string::npos) << s.message();
}

TEST(KdaL2Norm, ForwardUnitRowsAndBackwardMatchesFiniteDifferences) {
  PhiloxGenerator rng(6, 0);
  const Tensor x = RandomNormal({3, 2, 7}, DType::kF64, rng);
  const Tensor w = RandomNormal({3, 2, 7}, DType::kF64, rng);
  Tensor y, rstd;
  ASSERT_TRUE(KdaL2NormForward(x, 1e-6f, &y, &rstd).ok());
  ASSERT_EQ(rstd.shape(), (Shape{3, 2}));
  for (int64_t r = 0; r < 6; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < 7; ++d) ss += y.data<double>()[r * 7 + d] * y.data<double>()[r * 7 + d];
    EXPECT_NEAR(ss, 1.0, 1e-5);  // eps = 1e-6 inside the sqrt shrinks the norm by ~eps/|x|^2
  }
  Tensor dx;
  ASSERT_TRUE(KdaL2NormBackward(y, rstd, w, &dx).ok());
  CheckFd(
      x.Clone(),
      [&](const Tensor& xx) {
        Tensor yy, rr;
        EXPECT_TRUE(KdaL2NormForward(xx, 1e-6f, &yy, &rr).ok());
        return Dot(yy, w);
      },
      dx, "x");
}

}  // namespace
}  // namespace orrery::kernels
