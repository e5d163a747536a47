// The CUDA halves of kernels/grouped_gemm.h (kernels/cuda/grouped_gemm.cu). Callers
// (kernels/grouped_gemm_op.cc) have checked shapes, dtypes, devices, alignment and the dims'
// multiple; these only launch on the device context's stream. X, W, dY bf16; offsets i32 or i64.
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels::cuda {

// y [M, N] bf16 or f32, overwritten on the experts' rows.
Status GroupedGemmForwardCuda(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor* y);
// dx [M, K] f32 or bf16, overwritten or (accumulate) added to on the experts' rows.
Status GroupedGemmInputGradCuda(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                bool accumulate, Tensor* dx);
// dw [E, N, K] f32, accumulated.
Status GroupedGemmWeightGradCuda(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                 Tensor* dw);

}  // namespace orrery::kernels::cuda
