#include "core/half.h"

namespace orrery {

Float16 FloatToFloat16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Float16{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x47800000u) return Float16{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65536: Inf
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127;
  if (exp >= -14) {
    // Normal f16: 10 mantissa bits kept of 23; round to nearest even on the 13 dropped bits.
    uint32_t mant = abs & 0x7fffffu;
    uint32_t half = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into Inf: correct
    return Float16{static_cast<uint16_t>(sign | half)};
  }
  if (exp < -25) return Float16{sign};  // below half the smallest subnormal: rounds to zero
  // Subnormal f16: value = m * 2^-24. Shift the full 24-bit significand right.
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 1;  // 14..24 (so that 2^exp * 1.m == (mant >> shift) * 2^-24)
  uint32_t half = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t mid = 1u << (shift - 1);
  if (rest > mid || (rest == mid && (half & 1u))) ++half;
  return Float16{static_cast<uint16_t>(sign | half)};
}

float Float16ToFloat(Float16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // Inf/NaN
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return BitsToFloat(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) |
                       ((mant & 0x3ffu) << 13));
  }
  return BitsToFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

}  // namespace orrery
