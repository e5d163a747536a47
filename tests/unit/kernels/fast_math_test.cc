// The float forms of kernels/cpu/fast_math.h against the double-precision libm functions over a
// dense grid, at the error bounds the header states.
#include "kernels/cpu/fast_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace orrery::kernels::cpu {
namespace {

TEST(FastMathTest, ExpWithinAFewUlp) {
  for (float x = -87.0f; x <= 88.0f; x += 0.00731f) {
    const double ref = std::exp(static_cast<double>(x));
    // 2 ulp of the result's binade (float epsilon is 1 ulp at 1.0).
    EXPECT_NEAR(Exp(x) / ref, 1.0, 2.0 * std::numeric_limits<float>::epsilon()) << "x=" << x;
  }
  EXPECT_EQ(Exp(0.0f), 1.0f);
}

TEST(FastMathTest, ExpSaturatesAndPropagatesNan) {
  EXPECT_GT(Exp(1000.0f), 1e38f);
  EXPECT_TRUE(std::isfinite(Exp(1000.0f)));
  EXPECT_LT(Exp(-1000.0f), 2e-38f);
  EXPECT_GE(Exp(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(Exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastMathTest, TanhAndSigmoidMatchLibm) {
  for (float x = -30.0f; x <= 30.0f; x += 0.00377f) {
    const double xd = static_cast<double>(x);
    EXPECT_NEAR(Tanh(x), std::tanh(xd), 4e-7) << "x=" << x;
    EXPECT_NEAR(Sigmoid(x), 1.0 / (1.0 + std::exp(-xd)), 4e-7) << "x=" << x;
  }
  // Near zero tanh keeps its relative precision (the polynomial branch).
  for (float x = 1e-6f; x < 0.625f; x *= 1.37f) {
    EXPECT_NEAR(Tanh(x) / std::tanh(static_cast<double>(x)), 1.0, 4e-7) << "x=" << x;
    EXPECT_EQ(Tanh(-x), -Tanh(x));
  }
  EXPECT_EQ(Tanh(100.0f), 1.0f);
  EXPECT_EQ(Tanh(-100.0f), -1.0f);
  EXPECT_TRUE(std::isnan(Tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastMathTest, DoubleIsLibm) {
  EXPECT_EQ(Exp(0.3), std::exp(0.3));
  EXPECT_EQ(Tanh(0.3), std::tanh(0.3));
}

}  // namespace
}  // namespace orrery::kernels::cpu
