// Token embedding as Tensor-level ops: the gather of the forward and the scatter-add of its
// backward, dispatched by device (the CPU loops are the twin of the CUDA kernels).
//
//   y[n, :] = table[ids[n], :]            table [V, d], ids i32 [N] in [0, V), y [N, d]
//   dtable[ids[n], :] += dy[n, :]         rows of repeated ids accumulate
//
// CPU: table, y, dy, dtable f32 or f64 (one dtype). CUDA: table and y bf16 or f32 (one dtype), dy
// of that dtype, dtable f32 (the GPU model's fp32 gradients; the rows of a repeated id are added
// in a fixed order, so the result has the same bits on every run). An id outside [0, V) fails the
// call with OutOfRange naming the first such position; on CUDA that costs one 4-byte read back
// per call (ids come from the host's batches, once per step).
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// y is allocated [N, d] in table's dtype on its device when undefined.
Status EmbeddingGather(const Tensor& table, const Tensor& ids, Tensor* y);
Status EmbeddingScatterAdd(const Tensor& ids, const Tensor& dy, Tensor* dtable);

}  // namespace orrery::kernels
