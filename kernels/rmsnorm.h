// RMSNorm over the last dimension: y = x * rstd * w, rstd = (mean(x^2) + eps)^-1/2 per row.
//
// Plain CPU reference on contiguous rows, generic over float and double (double serves the
// finite-difference gradient checks). `w` may be null (no gain: the AttnRes keys, spec §6.1).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// x, y [rows, d]; rstd [rows] (saved for the backward). y may alias x.
template <typename T>
void RmsNormForward(const T* x, const T* w, int64_t rows, int64_t d, double eps, T* y, T* rstd);

// dx = rstd * (w*dy - xhat * mean(xhat * w * dy)) with xhat = x * rstd; dx is overwritten
// (it may alias dy). dw (when w and dw are non-null) is accumulated: dw += sum_rows dy * xhat.
template <typename T>
void RmsNormBackward(const T* x, const T* w, const T* rstd, const T* dy, int64_t rows, int64_t d,
                     T* dx, T* dw);

// Tensor-level forms, dispatched by device (the GPU model's ops; the templates above are their CPU
// twin). x [rows, d]: f32 or f64 on cpu, bf16 or f32 on cuda; w [d] of x's dtype or undefined; y
// like x (allocated when undefined); rstd [rows] in x's dtype on cpu, f32 on cuda.
Status RmsNorm(const Tensor& x, const Tensor& w, double eps, Tensor* y, Tensor* rstd);
// dx like x (allocated when undefined, overwritten); dw [d] accumulated when w is defined and dw is
// non-null: x's dtype on cpu, f32 on cuda (the fp32 gradients of the GPU model).
Status RmsNormGrad(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                   Tensor* dx, Tensor* dw);

}  // namespace orrery::kernels
