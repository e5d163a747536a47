// bfloat16 and IEEE half precision: storage types and conversions.
//
// float -> bf16/f16 rounds to nearest, ties to even (the rounding of the hardware converters);
// NaN stays NaN (quiet), overflow goes to +-Inf, f16 keeps subnormals.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace orrery {

struct BFloat16 {
  uint16_t bits = 0;
};
struct Float16 {
  uint16_t bits = 0;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline BFloat16 FloatToBFloat16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign, force a quiet payload bit
    return BFloat16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Carries into the
  // exponent are correct (rounding up to the next binade, or to Inf on overflow).
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

inline float BFloat16ToFloat(BFloat16 h) {
  return BitsToFloat(static_cast<uint32_t>(h.bits) << 16);
}

Float16 FloatToFloat16(float f);
float Float16ToFloat(Float16 h);

template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

}  // namespace orrery
