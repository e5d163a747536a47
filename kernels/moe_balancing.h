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
// 8-pass radix select on cuda.
//
// The distributed form (spec §5.4 step 6: ranks that share one global batch take the quantiles of
// all their rows) is the same radix select with its histograms summed over the ranks, so it is
// exact too and moves only 256 counts per column and pass: QuantileMargins gives a rank's margins
// where its scores are, MarginKeyHistogram one pass's counts for a set of (column, key prefix)
// queries, and the caller (model/quantile_balancing.cc) sums them over ranks and narrows the
// prefixes on the host, 8 bits a pass.
#pragma once

#include <bit>
#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// scores f32 [m, n] (unbiased sigmoid scores, m >= 1 tokens); bias f32 [n]; 1 <= top_k < n, n up
// to kMaxExperts (kernels/moe.h) and top_k up to kMaxTopK. thresholds f64 [n] (allocated when
// undefined), overwritten.
Status QuantileThresholds(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                          Tensor* thresholds);

// The margins m_ij above, transposed: f64 [n, m] (each expert's column contiguous), allocated when
// undefined, else checked and overwritten. Same arguments as QuantileThresholds, except that m may
// be 0 (a rank without tokens still takes part in the distributed selection).
Status QuantileMargins(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                       Tensor* margins);

// A double's order key: unsigned order of the keys is numeric order of the doubles (negative
// values bit-inverted, the sign bit set on the rest), and FromOrderKey inverts it.
inline uint64_t OrderKey(double x) {
  const uint64_t b = std::bit_cast<uint64_t>(x);
  return (b >> 63) ? ~b : b | (uint64_t{1} << 63);
}
inline double FromOrderKey(uint64_t key) {
  return std::bit_cast<double>((key >> 63) ? key & ~(uint64_t{1} << 63) : ~key);
}

// One pass of a radix select over margins f64 [n, m]: for query i, hist[i, d] = the number of
// values v of column cols[i] with OrderKey(v) >> (shift + 8) == prefixes[i] >> (shift + 8) and
// (OrderKey(v) >> shift) & 255 == d. cols i32 [Q] in [0, n); prefixes i64 [Q] (the key's bits);
// shift one of 56, 48, ..., 0; hist i32 [Q, 256] on the margins' device, allocated when
// undefined, else checked and overwritten. Column values beyond the checks are trusted on cuda.
Status MarginKeyHistogram(const Tensor& margins, const Tensor& cols, const Tensor& prefixes,
                          int shift, Tensor* hist);

}  // namespace orrery::kernels
