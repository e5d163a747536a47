// The device primitives of the MoE ops (kernels/moe.h, moe_balancing.h) on the CPU: the twins of
// the CUDA functions of the same names in kernels/cuda/moe_cuda.h (the per-token sums walk all rows
// in order through perm here, which adds each token's terms in ascending row order as CUDA does).
// Callers (kernels/moe_op.cc) have checked shapes, dtypes and devices; every floating tensor of one
// call shares one dtype (f32 or f64). M = N * k (token, slot) pairs, p = token * k + slot, and rows
// are the pairs sorted stably by expert (MoeExpertsSaved).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// ids, weights [N, k] from scores [N, E], bias f32 [E] or undefined, forced [N, k] or undefined.
// With forced, *bad_token is the first token whose forced row has an id outside [0, E) or a repeat
// (then nothing is written), else -1.
Status RouteTopKCpu(const Tensor& scores, const Tensor& bias, const Tensor& forced, double rho,
                    Tensor* ids, Tensor* weights, int64_t* bad_token);
// dlogits [N, E] overwritten.
Status RouteTopKGradCpu(const Tensor& scores, const Tensor& ids, const Tensor& dweights, double rho,
                        Tensor* dlogits);
// The stable counting sort of the pairs by ids[p]: perm i32 [M] (row -> p), rank i32 [N, k]
// (p -> row) and offsets [E + 1]; *bad_pair is the first p whose id is outside [0, E) (then perm
// and rank are not written), else -1.
Status MoePermuteCpu(const Tensor& ids, int64_t num_experts, Tensor* perm, Tensor* rank,
                     std::vector<int64_t>* offsets, int64_t* bad_pair);
// xg[row] = xl[perm[row] / k].
Status MoeGatherCpu(const Tensor& xl, const Tensor& perm, int64_t top_k, Tensor* xg);
// y[t] = sum over t's rows, ascending, of weights[p] * o[row]; y overwritten.
Status MoeCombineCpu(const Tensor& o, const Tensor& weights, const Tensor& perm, int64_t top_k,
                     Tensor* y);
// doe[row] = weights[p] * dy[t]; dweights[p] = dot(dy[t], o[row]) (overwritten).
Status MoeCombineGradCpu(const Tensor& dy, const Tensor& o, const Tensor& weights,
                         const Tensor& perm, int64_t top_k, Tensor* doe, Tensor* dweights);
// dxl[t] += sum over t's rows, ascending, of dxg[row].
Status MoeScatterAddCpu(const Tensor& dxg, const Tensor& perm, int64_t top_k, Tensor* dxl);

// kernels/moe_balancing.h: thresholds f64 [n] from scores f32 [m, n] and bias f32 [n].
Status QuantileThresholdsCpu(const Tensor& scores, const Tensor& bias, int64_t top_k,
                             bool exclusive, Tensor* thresholds);
// margins f64 [n, m]; hist i32 [Q, 256] (kernels/moe_balancing.h).
Status QuantileMarginsCpu(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                          Tensor* margins);
Status MarginKeyHistogramCpu(const Tensor& margins, const Tensor& cols, const Tensor& prefixes,
                             int shift, Tensor* hist);

}  // namespace orrery::kernels
