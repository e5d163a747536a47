// Shared by the GPU op tests (tests/gpu/*_gpu_test.cc): moving tensors to and from the device,
// NaN-poisoned outputs (an element a kernel never writes stays NaN and fails the comparison),
// and the relative-RMS comparison against a CPU twin computed in f64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/device.h"
#include "core/tensor.h"
#include "tests/unit/kernels/kda_test_util.h"

#define SKIP_WITHOUT_GPU() \
  if (::orrery::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

namespace orrery::kernels::gpu_test {

// The op tests' default tolerances (relative RMS): a bf16 output's rounding is about 1.1e-3 for a
// uniform half-ulp error of the 8-bit mantissa (1.65e-3 measured on Gaussian data), so 5e-3 is
// 3x that; f32 kernels differ from the f64 twin by summation order, about 1e-7 per op, so 2e-5.
inline constexpr double kBf16Tol = 5e-3;
inline constexpr double kF32Tol = 2e-5;
inline double TolFor(DType dt) { return dt == DType::kBF16 ? kBf16Tol : kF32Tol; }

// t rounded to dt and back to f64: what the GPU sees, in the reference's precision.
inline Tensor Round(const Tensor& t, DType dt) {
  return t.Cast(dt).value().Cast(DType::kF64).value();
}
inline Tensor ToGpu(const Tensor& t, DType dt) {
  return t.Cast(dt).value().To(Device::Cuda(0)).value();
}
inline Tensor ToGpu(const Tensor& t) { return t.To(Device::Cuda(0)).value(); }
inline Tensor ToHost(const Tensor& t) { return t.To(Device::Cpu()).value(); }
inline Tensor ToHostF64(const Tensor& t) { return ToHost(t).Cast(DType::kF64).value(); }

// A device tensor whose every byte is 0xFF: NaN in f32, f64 and bf16, -1 in i32.
inline Tensor Poisoned(const Shape& shape, DType dt) {
  Tensor h = Tensor::Empty(shape, dt);
  std::memset(h.raw_data(), 0xFF, h.nbytes());
  return ToGpu(h);
}

// Every element of `gpu` written (finite) and within `tol` relative RMS of `ref` (any device and
// float dtype); prints the error.
inline void ExpectClose(const Tensor& gpu, const Tensor& ref, double tol, const std::string& what) {
  const Tensor g = ToHostF64(gpu);
  for (int64_t i = 0; i < g.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(g.data<double>()[i])) << what << ": element " << i << " not written";
  }
  const double err = testing::RelRmsError(g, ToHostF64(ref));
  EXPECT_LE(err, tol) << what;
  std::printf("  %-34s rel RMS error %.3g (tolerance %.0e)\n", what.c_str(), err, tol);
}

}  // namespace orrery::kernels::gpu_test
