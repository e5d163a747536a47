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

// A batch of row-major matrices inside one tensor's storage: matrix i is `rows` x `cols`, its
// row r starting at element offset + i * batch_stride + r * ld of `t` (only t's storage, dtype and
// device are used, not its shape). The absorbed MLA reads and writes the per-head column blocks
// of its [n, H * width] activations this way: one product for all heads instead of a loop of
// copies and small products.
struct MatrixBatch {
  Tensor t;
  int64_t offset = 0;
  int64_t rows = 0, cols = 0;  // the stored matrix (op(x) is its transpose with trans_*)
  int64_t ld = 0;              // >= cols
  int64_t batch_stride = 0;
};

// c_i = alpha op(a_i) op(b_i) + beta c_i for i < batch, with Matmul's devices, dtypes and
// transposes: op(a_i) [m, k], op(b_i) [k, n], c_i [m, n] (c.t defined). Every matrix must lie
// inside its tensor (checked); the c_i must not overlap (not checked). CPU: a loop of OpenBLAS
// products (the twin); CUDA: one strided-batched cuBLASLt call.
Status MatmulStridedBatched(const MatrixBatch& a, const MatrixBatch& b, int64_t batch,
                            const MatmulOptions& options, const MatrixBatch& c);

}  // namespace orrery::kernels
