// The KDA layer's short causal depthwise convolution followed by SiLU (spec §2.1 step 2), within
// packed documents:
//   pre[t, c] = sum_{j < W} w[c, j] x[t - (W-1) + j, c]   (terms before t's document start are 0)
//   y[t, c]   = SiLU(pre[t, c]) = pre * sigmoid(pre)
// over x [N, C] (tokens by channels) and w [C, W] (the layer's conv_q / conv_k / conv_v). A token
// sees only the W - 1 tokens before it in its own document: cu [docs + 1] are the documents'
// starts, 0 = cu[0] <= cu[1] <= ... <= cu[docs] = N (an empty document is allowed).
//
// The templates are the plain CPU reference, generic over float and double (double serves the
// finite-difference gradient checks); the KDA layer (model/layers/kda.cc) calls them directly.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// y [N, C] (N = cu.back()); y may not alias x.
template <typename T>
void ShortConvSiluForward(const T* x, int64_t channels, const T* w, int64_t width,
                          const std::vector<int64_t>& cu, T* y);

// dx [N, C] is overwritten with dL/dx from the upstream dy; dw [C, W] is accumulated
// (dw += dL/dw). The pre-activation is recomputed from x (the forward keeps only y).
template <typename T>
void ShortConvSiluBackward(const T* x, int64_t channels, const T* w, int64_t width,
                           const std::vector<int64_t>& cu, const T* dy, T* dx, T* dw);

// The decode form (one new token per sequence, the inference engine's step): each sequence's
// last W - 1 pre-conv rows are row rows[n] of a history table hist [S, W - 1, C] (oldest first),
// and y[n] is the forward above at the last token of the window [hist[rows[n]] ; x[n]], its terms
// summed in the same order; then hist[rows[n]] becomes the window's last W - 1 rows (x[n] last).
// x, y [N, C]; w [C, W]. A negative rows[n] (padding) sees a zero history and writes none.
template <typename T>
void ShortConvSiluDecodeStep(const T* x, int64_t n, int64_t channels, const T* w, int64_t width,
                             const int32_t* rows, T* hist, T* y);

// Tensor-level forms, dispatched by device (the GPU model's op; the templates above are its CPU
// twin). x [N, C]: f32 or f64 on cpu, bf16 or f32 on cuda; w [C, W] of x's dtype with
// 1 <= W <= 16 (the config's conv_size range); cu_seqlens i64 [docs + 1] on x's device. The
// starts are checked on the host: `cu_host`, when defined, is the same i64 [docs + 1] on the CPU
// and is what is checked; without it a CUDA cu_seqlens is read back, which waits for the stream
// on every call (the GPU model passes both). y like x (allocated when undefined).
Status ShortConvSilu(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                     const Tensor& cu_host, Tensor* y);
Status ShortConvSilu(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens, Tensor* y);
// dx like x (allocated when undefined, overwritten). dw [C, W] accumulated: x's dtype on cpu, f32
// on cuda (the fp32 gradients of the GPU model); allocated zeroed when undefined.
Status ShortConvSiluGrad(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                         const Tensor& cu_host, const Tensor& dy, Tensor* dx, Tensor* dw);
Status ShortConvSiluGrad(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                         const Tensor& dy, Tensor* dx, Tensor* dw);
// The decode form: x [N, C], w [C, W] as ShortConvSilu; hist [S, W - 1, C] in x's dtype, updated
// in place (undefined when W = 1); rows i32 [N] on x's device, distinct. A negative row is
// padding: a zero history, nothing written. On cpu a row >= S is an InvalidArgument error; on
// cuda rows are not checked (no read back). y like x (allocated when undefined).
Status ShortConvSiluDecode(const Tensor& x, const Tensor& w, const Tensor& rows, Tensor* hist,
                           Tensor* y);

}  // namespace orrery::kernels
