// Block Attention Residuals: one depth-mixing operator (spec §6.1, §6.3), generic over float and
// double, computed per token row:
//   r_i = (mean_d(v_i^2) + eps)^-1/2,  score_i = <r_i v_i, gamma * w>,  p = softmax_i(score),
//   h = sum_i p_i v_i
// over n sources v_i [rows, d] (the completed blocks and the current partial sum). w is the
// pseudo-query, gamma the key-norm gain folded into it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// h [rows, d]; p [rows, n] saved for the backward (may be null when not training).
template <typename T>
void AttnResForward(const std::vector<const T*>& sources, int64_t rows, int64_t d, const T* w,
                    const T* gamma, double eps, T* h, T* p);

// Accumulates: d_sources[i] += dL/dv_i (a null entry skips that source), dw += ..., dgamma += ...
template <typename T>
void AttnResBackward(const std::vector<const T*>& sources, int64_t rows, int64_t d, const T* w,
                     const T* gamma, double eps, const T* p, const T* dh,
                     const std::vector<T*>& d_sources, T* dw, T* dgamma);

// Tensor-level forms, dispatched by device (the GPU model's op; the templates above are its CPU
// twin). sources: n >= 1 tensors [rows, d] of one dtype on one device (f32 or f64 on cpu, bf16 or
// f32 on cuda, where n is at most 128: the source pointers travel as one kernel argument);
// w, gamma [d] of that dtype. Scores, softmax and the weighted sum are computed in f32 (f64 for
// f64) and h is rounded to the dtype once (spec §6.4). h like the sources (allocated when
// undefined); p [rows, n] (the dtype on cpu, f32 on cuda; allocated when undefined) is saved for
// the backward, and may be null when not training.
Status AttnResMix(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                  double eps, Tensor* h, Tensor* p);
// d_sources: n entries, each undefined (skipped: a source that needs no gradient) or [rows, d]
// accumulated (+=; the per-block gradient accumulators of spec §6.3, which several mixes add
// into). dw, dgamma [d] accumulated, allocated zeroed when undefined. Gradients are the dtype on
// cpu and f32 on cuda (the GPU model's residual and parameter gradients). h is not needed: the
// backward recomputes what it uses from the sources and p.
Status AttnResMixGrad(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                      double eps, const Tensor& p, const Tensor& dh, std::vector<Tensor>* d_sources,
                      Tensor* dw, Tensor* dgamma);

}  // namespace orrery::kernels
