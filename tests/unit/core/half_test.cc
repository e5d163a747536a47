#include "core/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace orrery {
namespace {

uint16_t Bf(float f) { return FloatToBFloat16(f).bits; }
uint16_t Fp16(float f) { return FloatToFloat16(f).bits; }

TEST(BFloat16Test, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, 1e-38f}) {
    float back = BFloat16ToFloat(FloatToBFloat16(f));
    if (f == 1e-38f) continue;  // not exactly representable; covered below
    EXPECT_EQ(back, f);
  }
  EXPECT_EQ(Bf(-0.0f), 0x8000);
}

TEST(BFloat16Test, TiesRoundToEven) {
  // 1 + 2^-8 lies exactly between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): goes to even.
  EXPECT_EQ(Bf(BitsToFloat(0x3f808000u)), 0x3f80);
  // 1 + 3*2^-8 lies between 0x3f81 (odd) and 0x3f82 (even): goes to 0x3f82.
  EXPECT_EQ(Bf(BitsToFloat(0x3f818000u)), 0x3f82);
  // Just above the tie rounds up, just below rounds down.
  EXPECT_EQ(Bf(BitsToFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(Bf(BitsToFloat(0x3f807fffu)), 0x3f80);
}

TEST(BFloat16Test, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Bf(inf), 0x7f80);
  EXPECT_EQ(Bf(-inf), 0xff80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  // A NaN whose payload lives only in the low 16 bits must not become Inf.
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(BitsToFloat(0x7f800001u)))));
  EXPECT_EQ(Bf(BitsToFloat(0xff800001u)) & 0x8000, 0x8000);  // sign kept
  // The largest finite float rounds up to Inf (beyond bf16 max + half ulp).
  EXPECT_EQ(Bf(std::numeric_limits<float>::max()), 0x7f80);
  // bf16 max itself stays finite.
  EXPECT_EQ(Bf(BitsToFloat(0x7f7f0000u)), 0x7f7f);
}

TEST(Float16Test, ExactValuesRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 6.103515625e-05f /*min normal*/,
                  5.960464477539063e-08f /*min subnormal*/}) {
    EXPECT_EQ(Float16ToFloat(FloatToFloat16(f)), f) << f;
  }
  EXPECT_EQ(Fp16(1.0f), 0x3c00);
  EXPECT_EQ(Fp16(65504.0f), 0x7bff);
  EXPECT_EQ(Fp16(5.960464477539063e-08f), 0x0001);
}

TEST(Float16Test, RoundingAndOverflow) {
  // 1 + 2^-11 is a tie between 1 (even) and 1 + 2^-10: to even.
  EXPECT_EQ(Fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 ties between 0x3c01 (odd) and 0x3c02: to even.
  EXPECT_EQ(Fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // 65520 is the tie between 65504 and 65536 (Inf): to even, which is Inf.
  EXPECT_EQ(Fp16(65520.0f), 0x7c00);
  EXPECT_EQ(Fp16(65519.0f), 0x7bff);
  EXPECT_EQ(Fp16(1e10f), 0x7c00);
  EXPECT_EQ(Fp16(-1e10f), 0xfc00);
  // Half the smallest subnormal is a tie with zero (even): rounds to 0; a bit more rounds to 1.
  EXPECT_EQ(Fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(Fp16(std::ldexp(1.0f, -25) * 1.01f), 0x0001);
  // Subnormal tie: 1.5 * 2^-24 lies between 1 and 2 units: to even (2).
  EXPECT_EQ(Fp16(1.5f * std::ldexp(1.0f, -24)), 0x0002);
  EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Float16ToFloat(Float16{0x7c00})));
}

TEST(Float16Test, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    Float16 h{static_cast<uint16_t>(b)};
    float f = Float16ToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToFloat16(f).bits, h.bits) << b;
  }
}

TEST(BFloat16Test, EveryBFloat16RoundTripsThroughFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    BFloat16 h{static_cast<uint16_t>(b)};
    float f = BFloat16ToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f).bits, h.bits) << b;
  }
}

}  // namespace
}  // namespace orrery
