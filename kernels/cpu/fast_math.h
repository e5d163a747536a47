// Elementwise exp, sigmoid and tanh for the CPU kernels and model layers, generic over float and
// double.
//
// float: inline, branch-free polynomial forms (no libm call), accurate to a few ulp: Exp within
// 2 ulp of the correctly rounded result on [-87, 88], Tanh and Sigmoid within 4e-7 absolute. They
// replace glibc's tanhf (built on expm1f) and expf calls, which took about 30% of the tiny model's
// training step (docs/benchmarks.md, "Model (CPU)"). double: std::exp / std::tanh unchanged, so
// the f64 finite-difference checks see the exact functions.
//
// Range: Exp(float) saturates outside [-87.3, 88.3] (returns e^-87.3 ~ 1.2e-38 below, e^88.3
// above) instead of returning 0 or inf; Sigmoid and Tanh are exact to float precision there
// anyway. NaN propagates.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace orrery::kernels::cpu {

inline float Exp(float x) {
  // e^x = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (ln 2 split in two for exactness),
  // e^r by a degree-6 minimax polynomial on |r| <= ln2/2.
  x = std::min(std::max(x, -87.3f), 88.3f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  int32_t ti;
  std::memcpy(&ti, &t, sizeof ti);
  const int32_t bits = (ti - 0x4B400000 + 127) << 23;  // 2^n: n is the low bits of t's mantissa
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return er * scale;
}

inline double Exp(double x) { return std::exp(x); }

inline float Sigmoid(float x) { return 1.0f / (1.0f + Exp(-x)); }
inline double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

inline float Tanh(float x) {
  // Small |x|: odd minimax polynomial (no cancellation); otherwise 1 - 2 / (e^{2|x|} + 1).
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float ax = std::fabs(x);
  const float large = 1.0f - 2.0f / (Exp(2.0f * ax) + 1.0f);
  return ax < 0.625f ? small : std::copysign(large, x);
}

inline double Tanh(double x) { return std::tanh(x); }

}  // namespace orrery::kernels::cpu
