// Shared helpers of the KDA tests: random inputs in the regime the layer produces (L2-normalised
// q/k, beta in (0,1), g in the bounded range or from the original gate), and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/kda.h"

namespace orrery::kernels::testing {

struct KdaShape {
  int64_t b, t, h, k, v;
};

// A tensor of `shape` and `dtype` (f32 or f64) with N(0, 1) entries times `scale`.
inline Tensor RandomNormal(const Shape& shape, DType dtype, PhiloxGenerator& rng,
                           double scale = 1.0) {
  Tensor x = Tensor::Empty(shape, DType::kF64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = scale * rng.Normal();
  return dtype == DType::kF64 ? x : x.Cast(dtype).value();
}

// Rows of the last dimension normalised to unit length (in f64, then cast).
inline Tensor RandomUnitRows(const Shape& shape, DType dtype, PhiloxGenerator& rng) {
  Tensor x = RandomNormal(shape, DType::kF64, rng);
  const int64_t k = shape.back();
  double* p = x.data<double>();
  for (int64_t r = 0; r < x.numel() / k; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < k; ++d) ss += p[r * k + d] * p[r * k + d];
    for (int64_t d = 0; d < k; ++d) p[r * k + d] /= std::sqrt(ss);
  }
  return dtype == DType::kF64 ? x : x.Cast(dtype).value();
}

// Uniform in [lo, hi).
inline Tensor RandomUniform(const Shape& shape, DType dtype, PhiloxGenerator& rng, double lo,
                            double hi) {
  Tensor x = Tensor::Empty(shape, DType::kF64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = lo + (hi - lo) * rng.Uniform();
  return dtype == DType::kF64 ? x : x.Cast(dtype).value();
}

// Inputs as the layer would feed them: q, k unit rows, g in (g_lo, 0), beta in (0.05, 0.95).
inline KdaInputs RandomKdaInputs(const KdaShape& s, DType dtype, uint64_t seed, bool with_state,
                                 double g_lo = -5.0) {
  PhiloxGenerator rng(seed, 0);
  KdaInputs in;
  in.q = RandomUnitRows({s.b, s.t, s.h, s.k}, dtype, rng);
  in.k = RandomUnitRows({s.b, s.t, s.h, s.k}, dtype, rng);
  in.v = RandomNormal({s.b, s.t, s.h, s.v}, dtype, rng);
  in.g = RandomUniform({s.b, s.t, s.h, s.k}, dtype, rng, g_lo, 0.0);
  in.beta = RandomUniform({s.b, s.t, s.h}, dtype, rng, 0.05, 0.95);
  if (with_state) {
    in.initial_state =
        RandomNormal({s.b, s.h, s.k, s.v}, dtype == DType::kF64 ? DType::kF64 : DType::kF32, rng);
  }
  return in;
}

inline std::vector<double> ToDoubles(const Tensor& t) {
  Tensor c = t.device().is_cpu() ? t : t.To(Device::Cpu()).value();
  Tensor d = c.dtype() == DType::kF64 ? c : c.Cast(DType::kF64).value();
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

// max |a - b| / max(1, max |b|): errors relative to the scale of the reference.
inline double MaxRelError(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = ToDoubles(a), y = ToDoubles(b);
  EXPECT_EQ(x.size(), y.size());
  double err = 0, scale = 1;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    err = std::max(err, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return err / scale;
}

// ||a - b|| / ||b||: fla's relative RMS measure (spec §2.8).
inline double RelRmsError(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = ToDoubles(a), y = ToDoubles(b);
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace orrery::kernels::testing
