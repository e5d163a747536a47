// The CUDA halves of the MoE ops' primitives (kernels/moe.h, moe_balancing.h), twins of
// kernels/cpu/moe_cpu.h (the per-token sums walk a token's rows through rank here, the CPU twin
// walks all rows through perm). Callers (kernels/moe_op.cc) have checked shapes, dtypes and
// devices; these only launch on the device context's stream. Router tensors are f32; expert
// activations T (bf16 or f32); dweights, dxg and dxl f32; ids, perm, rank i32.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels::cuda {

// ids, weights [N, k]; with forced, *bad_token is the first token whose forced row has an id
// outside [0, E) or a repeat (then ids and weights of that token are not written), else -1. The
// check reads back 4 bytes, only when forced is defined.
Status RouteTopKCuda(const Tensor& scores, const Tensor& bias, const Tensor& forced, double rho,
                     Tensor* ids, Tensor* weights, int64_t* bad_token);
// dlogits [N, E] overwritten.
Status RouteTopKGradCuda(const Tensor& scores, const Tensor& ids, const Tensor& dweights,
                         double rho, Tensor* dlogits);
// The stable counting sort: perm [M], rank [N, k], *offsets_device i32 [E + 1] (allocated).
// With offsets non-null, the offsets are copied to the host too (one copy of E + 2 ints, with the
// stream synchronised) and *bad_pair is the first p whose id is outside [0, E) (then perm and rank
// are not valid), else -1. With offsets null nothing is read back and *bad_pair is -1: a bad pair
// is placed in no expert's rows, and perm and rank are zero-filled first, so that every entry
// still names a valid pair or row.
Status MoePermuteCuda(const Tensor& ids, int64_t num_experts, Tensor* perm, Tensor* rank,
                      Tensor* offsets_device, std::vector<int64_t>* offsets, int64_t* bad_pair);
// xg[row] = xl[perm[row] / k].
Status MoeGatherCuda(const Tensor& xl, const Tensor& perm, int64_t top_k, Tensor* xg);
// y[t] = sum over t's rows, ascending, of weights[p] o[row] (f32 sums); y overwritten.
Status MoeCombineCuda(const Tensor& o, const Tensor& weights, const Tensor& rank, Tensor* y);
// doe[row] = weights[p] dy[t] (o's dtype); dweights[p] = dot(dy[t], o[row]) (f32, overwritten).
Status MoeCombineGradCuda(const Tensor& dy, const Tensor& o, const Tensor& weights,
                          const Tensor& perm, int64_t top_k, Tensor* doe, Tensor* dweights);
// dxl[t] += sum over t's rows, ascending, of dxg[row] (f32).
Status MoeScatterAddCuda(const Tensor& dxg, const Tensor& rank, Tensor* dxl);

// kernels/moe_balancing.h: thresholds f64 [n] from scores f32 [m, n] and bias f32 [n].
Status QuantileThresholdsCuda(const Tensor& scores, const Tensor& bias, int64_t top_k,
                              bool exclusive, Tensor* thresholds);
Status QuantileMarginsCuda(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                           Tensor* margins);
Status MarginKeyHistogramCuda(const Tensor& margins, const Tensor& cols, const Tensor& prefixes,
                              int shift, Tensor* hist);

}  // namespace orrery::kernels::cuda
