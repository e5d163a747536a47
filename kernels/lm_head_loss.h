// The LM head fused with the cross-entropy loss and its backward, chunked over tokens so that the
// logits of all N tokens never exist at once: per chunk of `chunk_rows` rows the logits [rows, V]
// are formed (f32), turned into the loss and, in place of themselves, into d loss / d logits, which
// two products take back to dx and dW. Peak extra memory: chunk_rows x V x (4 + 2) bytes.
//
//   z_n = x_n W^T,  loss_sum = sum_n m_n (logsumexp(z_n) - z_n[t_n])
//   dz_n = s m_n (softmax(z_n) - onehot(t_n)),  dx = dz W (overwritten),  dW += dz^T x
//
// x [N, d], W [V, d], targets i32 [N] in [0, V), mask f32 [N] (undefined: all ones; a zero weight
// ignores the row, whatever its target), s = grad_scale. CPU (the twin): x, W, dx, dW f32 or f64,
// the softmax in f64. CUDA: x and W bf16 (dz rounded to bf16 for the products, as the GPU model's
// activations) or all f32 (the debug mode); dx in x's dtype, dW f32; the per-row softmax in f32.
// A target outside [0, V) fails with OutOfRange (on CUDA: one flag read back per call, which also
// brings the loss back).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

struct LmHeadLossOptions {
  int64_t chunk_rows = 4096;  // tokens per chunk (> 0)
  double grad_scale = 1.0;
};

// loss_sum receives the masked sum; dx (allocated like x when undefined) and dw (required when
// non-null, accumulated) may be null to skip the backward (then it is a loss-only evaluation).
Status LmHeadCrossEntropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                          const Tensor& mask, const LmHeadLossOptions& options, double* loss_sum,
                          Tensor* dx, Tensor* dw);

}  // namespace orrery::kernels
