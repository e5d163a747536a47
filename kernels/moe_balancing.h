// The statistics of Quantile Balancing (spec §5.4) as a Tensor-level op, dispatched by device: the
// per-expert thresholds c_j of model::QuantileBalancingStep, computed where the scores are (the
// GPU model's scores never leave the device; only the E thresholds do). The CPU twin is
// model/quantile_balancing.cc's computation on tensors; the bias update b_j <- b_j - eta c_j and
// the re-centring stay with the caller (E numbers, on the host).
//
// Per token i, from the biased row s_i + b (compared in f64): tau_k, tau_k1 = its k-th and
// (k+1)-th largest; margins m_ij = s_ij + b_j - tau_k1 (cut-off form), or in the exclusive form
// s_ij + b_j - tau_k1 where that is > 0 and s_ij + b_j - tau_k elsewhere. With q = m k / n and
// r = min(m - 1, ceil(q)): c_j = the (r+1)-th largest margin of column j (cut-off), or the midpoint
// of the r-th and (r+1)-th largest (exclusive; the (r+1)-th alone when r = 0).
//
// This version is exact: it materialises the margins (8 m n bytes) and selects per column by an
// 8-pass radix select on cuda. The distributed form (histograms all-reduced over ranks, spec §5.4
// step 6) is later work behind the same interface.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// scores f32 [m, n] (unbiased sigmoid scores, m >= 1 tokens); bias f32 [n]; 1 <= top_k < n, n up
// to kMaxExperts (kernels/moe.h) and top_k up to kMaxTopK. thresholds f64 [n] (allocated when
// undefined), overwritten.
Status QuantileThresholds(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                          Tensor* thresholds);

}  // namespace orrery::kernels
