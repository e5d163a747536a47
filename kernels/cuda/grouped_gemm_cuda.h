// The CUDA halves of kernels/grouped_gemm.h: the mma.sync kernels (kernels/cuda/grouped_gemm.cu,
// any of this library's devices) and the wgmma/TMA kernel (kernels/cuda/grouped_gemm_wgmma.cu,
// sm_90 only). Callers (kernels/grouped_gemm_op.cc) have checked shapes, dtypes, devices,
// alignment and the dims' multiple, and chosen the kernel; these only launch on the device
// context's stream. X, W, dY bf16; offsets i32 or i64.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/situ.h"

namespace orrery::kernels::cuda {

// y [M, N] bf16 or f32, overwritten on the experts' rows.
Status GroupedGemmForwardMma(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor* y);
// dx [M, K] f32 or bf16, overwritten or (accumulate) added to on the experts' rows.
Status GroupedGemmInputGradMma(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                               bool accumulate, Tensor* dx);
// dw [E, N, K] f32, accumulated.
Status GroupedGemmWeightGradMma(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                Tensor* dw);

// Whether device `device` runs the wgmma kernel (compute capability 9.0: the sm_90a code).
bool GroupedGemmWgmmaAvailable(int device);
// Whether the wgmma kernel takes M rows and W's [N, K] (TMA's 32-bit coordinates: each < 2^31).
bool GroupedGemmWgmmaSupports(int64_t m, int64_t n, int64_t k);

// The same three products on the wgmma kernel, same contracts. tile_n: the C tile's columns,
// 256 or 128, or 0 for the kernel's choice by the estimated tile count.
Status GroupedGemmForwardWgmma(const Tensor& x, const Tensor& w, const Tensor& offsets, int tile_n,
                               Tensor* y);
Status GroupedGemmInputGradWgmma(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                                 bool accumulate, int tile_n, Tensor* dx);
Status GroupedGemmWeightGradWgmma(const Tensor& dy, const Tensor& x, const Tensor& offsets,
                                  int tile_n, Tensor* dw);
// GroupedGemmGlu's fused kernel: h [M, F] bf16 or f32; a, u null or tensors of h's shape and dtype;
// tile_n: as above (h's tile is half of it).
Status GroupedGemmGluWgmma(const GluActivation& act, const Tensor& x, const Tensor& w1,
                           const Tensor& w3, const Tensor& offsets, int tile_n, Tensor* h,
                           Tensor* a, Tensor* u);

}  // namespace orrery::kernels::cuda
