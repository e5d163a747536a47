// Block Attention Residuals: one depth-mixing operator (spec §6.1, §6.3), generic over float and
// double, computed per token row:
//   r_i = (mean_d(v_i^2) + eps)^-1/2,  score_i = <r_i v_i, gamma * w>,  p = softmax_i(score),
//   h = sum_i p_i v_i
// over n sources v_i [rows, d] (the completed blocks and the current partial sum). w is the
// pseudo-query, gamma the key-norm gain folded into it.
#pragma once

#include <cstdint>
#include <vector>

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

}  // namespace orrery::kernels
