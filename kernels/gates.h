// Element-wise sigmoid gating and the small helpers of the GPU model's forward and backward:
//   SigmoidGate  y = x * sigmoid(z)   (the KDA and gated-MLA output gates, spec §2.1 step 8)
//   Sigmoid      y = sigmoid(x)       (the MoE router's scores, spec §5.1)
//   AddInto      y += alpha * x       (gradient accumulation into f32, residual sums)
//   CastInto     y = x in y's dtype   (f32 <-> bf16: compute copies, f32 gradients of bf16 tensors)
//   AddRowBias   y[r, :] += b         (the bias of the KDA low-rank output gate, spec §2.1 step 8)
//   RowBiasGrad  db += sum_r dy[r, :] (its gradient)
//
// The templates are the plain CPU reference (the CUDA kernels' twin); the Tensor-level forms
// dispatch by device.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// x, z, y [n]; y may alias x or z.
template <typename T>
void SigmoidGateForward(const T* x, const T* z, int64_t n, T* y);
// dx = dy * s, dz = dy * x * s * (1 - s) with s = sigmoid(z); dx, dz are overwritten.
template <typename T>
void SigmoidGateBackward(const T* x, const T* z, const T* dy, int64_t n, T* dx, T* dz);
template <typename T>
void SigmoidForward(const T* x, int64_t n, T* y);
// y += alpha * x in Y's precision (f32 arithmetic for a bf16 x into an f32 y). Instantiated for
// (float, float), (double, double) and (BFloat16, float).
template <typename X, typename Y>
void AddScaled(const X* x, float alpha, int64_t n, Y* y);
// y = x, rounded to nearest even on the way to bf16. Instantiated for float and BFloat16 both
// ways and to themselves.
template <typename X, typename Y>
void Convert(const X* x, int64_t n, Y* y);
// y [rows, cols] += b [cols] per row; db [cols] += the column sums of dy [rows, cols] (summed in
// T's precision, row by row). Instantiated for float and double.
template <typename T>
void AddRowBiasForward(const T* b, int64_t rows, int64_t cols, T* y);
template <typename T>
void RowBiasBackward(const T* dy, int64_t rows, int64_t cols, T* db);

// Tensor-level forms. Unless said otherwise: tensors of one shape on one device, f32 or f64 on
// cpu, bf16 or f32 on cuda, arithmetic in f32 (f64 for f64); outputs allocated when undefined.

// y, z like x.
Status SigmoidGate(const Tensor& x, const Tensor& z, Tensor* y);
// z, dy like x; dx, dz like x, overwritten.
Status SigmoidGateGrad(const Tensor& x, const Tensor& z, const Tensor& dy, Tensor* dx, Tensor* dz);
// y in x's dtype (when undefined), or an f32 y for a bf16 x on cuda (scores kept in f32).
Status Sigmoid(const Tensor& x, Tensor* y);
// y (defined) += alpha * x: both of one dtype, or x bf16 into an f32 y (cpu and cuda).
Status AddInto(const Tensor& x, float alpha, Tensor* y);
// y (defined) = x converted: f32 or bf16 to f32 or bf16, one shape, on cpu or cuda.
Status CastInto(const Tensor& x, Tensor* y);
// y (defined, 2-D [rows, cols]) += b [cols] in every row; b of y's dtype.
Status AddRowBias(const Tensor& b, Tensor* y);
// db (defined, [cols]) += the column sums of dy [rows, cols]: dy of db's dtype, or a bf16 dy into
// an f32 db on cuda (the sums in f32).
Status RowBiasGrad(const Tensor& dy, Tensor* db);

}  // namespace orrery::kernels
