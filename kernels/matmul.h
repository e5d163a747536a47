// Matmul: the Tensor-level dense product of the GPU model, with its CPU twin.
//
//   c = alpha * op(a) op(b) + beta * c,   op(x) = x or x^T;  op(a) [m, k], op(b) [k, n], c [m, n]
//
// Every tensor is 2-D, contiguous and row-major, all on one device:
//   CPU  (the twin): a, b, c all f32 or all f64, through kernels/gemm.h (OpenBLAS).
//   CUDA (cuBLASLt, fp32 accumulation): a, b bf16 with c bf16 (activations) or f32 (weight
//        gradients accumulated with beta = 1); or a, b, c all f32, computed in full fp32 (no
//        TF32: the debug mode that matches the CPU model to rounding).
// When *c is undefined it is allocated on a's device in a's dtype (then beta must be 0).
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

struct MatmulOptions {
  bool trans_a = false;
  bool trans_b = false;  // true for the linear layers' y = x W^T with W [out, in]
  float alpha = 1.0f;
  float beta = 0.0f;
};

Status Matmul(const Tensor& a, const Tensor& b, const MatmulOptions& options, Tensor* c);

}  // namespace orrery::kernels
