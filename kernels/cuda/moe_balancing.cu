// QuantileThresholds, QuantileMargins and MarginKeyHistogram (kernels/moe_balancing.h).
// QuantileThresholds in two launches:
//   MarginsKernel: one warp per token stages s + b in shared memory as f64 (as the CPU twin adds
//                  them), finds the k-th and (k+1)-th largest by k + 1 rounds of a warp arg-max
//                  (the values with multiplicity, as the twin's nth_element), and writes the
//                  token's margins transposed, [n, m], so that each expert's column is contiguous.
//   SelectKernel:  one block per expert, an exact radix select over the column's order-preserving
//                  64-bit keys, 8 bits a pass from the top (a shared 256-bin histogram per pass).
// Every value is the twin's f64 value and the selection is exact, so the thresholds equal the
// twin's bit for bit. Not yet timed: correct first.
// QuantileMargins is MarginsKernel alone; MarginKeyHistogram one SelectAscending pass per query
// (HistogramKernel: one block per query, a shared 256-bin histogram of the matching keys).
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/moe_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kSelectThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ bool Larger(double vb, int ib, double va, int ia) {
  return ib != INT_MAX && (ia == INT_MAX || vb > va || (vb == va && ib < ia));
}

__global__ void MarginsKernel(const float* __restrict__ scores, const float* __restrict__ bias,
                              int64_t m, int n, int k, bool exclusive,
                              double* __restrict__ margins) {
  extern __shared__ double staged[];  // [kWarps, n]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  double* v = staged + warp * n;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < m;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    for (int i = lane; i < n; i += 32) v[i] = static_cast<double>(scores[t * n + i]) + bias[i];
    __syncwarp();
    unsigned taken = 0;
    double tau_k = 0, tau_k1 = 0;
    for (int j = 0; j <= k; ++j) {
      double best = 0;
      int bi = INT_MAX;
      for (int c = 0, i = lane; i < n; ++c, i += 32) {
        if (!((taken >> c) & 1u) && Larger(v[i], i, best, bi)) {
          best = v[i];
          bi = i;
        }
      }
      for (int off = 16; off > 0; off >>= 1) {
        const double ob = __shfl_xor_sync(kFull, best, off);
        const int oi = __shfl_xor_sync(kFull, bi, off);
        if (Larger(ob, oi, best, bi)) {
          best = ob;
          bi = oi;
        }
      }
      if (lane == bi % 32) taken |= 1u << (bi / 32);
      if (j == k - 1) tau_k = best;
      if (j == k) tau_k1 = best;
    }
    for (int i = lane; i < n; i += 32) {
      margins[static_cast<int64_t>(i) * m + t] =
          !exclusive || v[i] > tau_k1 ? v[i] - tau_k1 : v[i] - tau_k;
    }
    __syncwarp();  // every lane is done with v before the next token overwrites it
  }
}

// Keys whose unsigned order is the doubles' order.
__device__ __forceinline__ unsigned long long KeyOf(double x) {
  const unsigned long long b = static_cast<unsigned long long>(__double_as_longlong(x));
  return (b >> 63) ? ~b : b | (1ull << 63);
}
__device__ __forceinline__ double ValueOf(unsigned long long key) {
  const unsigned long long b = (key >> 63) ? key & ~(1ull << 63) : ~key;
  return __longlong_as_double(static_cast<long long>(b));
}

// The element of ascending rank `rank` (0-based) of col [m]; every thread of the block returns it.
__device__ double SelectAscending(const double* col, int64_t m, int64_t rank) {
  __shared__ unsigned hist[256];
  __shared__ unsigned long long prefix_s;
  __shared__ long long rank_s;
  if (threadIdx.x == 0) {
    prefix_s = 0;
    rank_s = rank;
  }
  unsigned long long mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const unsigned long long prefix = prefix_s;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
      const unsigned long long key = KeyOf(col[i]);
      // An exact integer count: the same whatever order the threads add in.
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      long long below = 0;
      int b = 0;
      while (below + hist[b] <= rank_s) below += hist[b++];
      rank_s -= below;
      prefix_s = prefix | (static_cast<unsigned long long>(b) << shift);
    }
    mask |= 255ull << shift;
    __syncthreads();
  }
  const double result = ValueOf(prefix_s);
  __syncthreads();  // all have read prefix_s before a next call resets it
  return result;
}

__global__ void SelectKernel(const double* __restrict__ margins, int64_t m, int64_t r,
                             bool exclusive, double* __restrict__ thresholds) {
  const double* col = margins + static_cast<int64_t>(blockIdx.x) * m;
  // Descending rank r is ascending rank m - 1 - r.
  const double at_r = SelectAscending(col, m, m - 1 - r);
  if (!exclusive) {
    if (threadIdx.x == 0) thresholds[blockIdx.x] = at_r;
    return;
  }
  const double before = SelectAscending(col, m, m - 1 - (r - 1 >= 0 ? r - 1 : 0));
  if (threadIdx.x == 0) thresholds[blockIdx.x] = 0.5 * (before + at_r);
}

__global__ void HistogramKernel(const double* __restrict__ margins, int64_t m,
                                const int* __restrict__ cols,
                                const long long* __restrict__ prefixes, int shift,
                                int* __restrict__ out) {
  __shared__ unsigned hist[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  const double* col = margins + static_cast<int64_t>(cols[blockIdx.x]) * m;
  const unsigned long long high = shift + 8 >= 64 ? 0ull : ~0ull << (shift + 8);
  const unsigned long long prefix = static_cast<unsigned long long>(prefixes[blockIdx.x]) & high;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const unsigned long long key = KeyOf(col[i]);
    if ((key & high) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);  // integer: exact
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    out[static_cast<int64_t>(blockIdx.x) * 256 + b] = static_cast<int>(hist[b]);
  }
}

Status LaunchMargins(DeviceContext* ctx, const Tensor& scores, const Tensor& bias, int64_t top_k,
                     bool exclusive, Tensor* margins) {
  const int64_t m = scores.dim(0), n = scores.dim(1);
  MarginsKernel<<<GridFor(m, kWarps), kThreads, sizeof(double) * kWarps * n, ctx->stream()>>>(
      scores.data<float>(), bias.data<float>(), m, static_cast<int>(n), static_cast<int>(top_k),
      exclusive, margins->data<double>());
  return LastLaunchStatus("MarginsKernel");
}

}  // namespace

Status QuantileMarginsCuda(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                           Tensor* margins) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(scores.device().index));
  return LaunchMargins(ctx, scores, bias, top_k, exclusive, margins);
}

Status MarginKeyHistogramCuda(const Tensor& margins, const Tensor& cols, const Tensor& prefixes,
                              int shift, Tensor* hist) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(margins.device().index));
  if (cols.numel() == 0) return Status::OK();
  HistogramKernel<<<static_cast<unsigned>(cols.numel()), kSelectThreads, 0, ctx->stream()>>>(
      margins.data<double>(), margins.dim(1), cols.data<int32_t>(),
      reinterpret_cast<const long long*>(prefixes.data<int64_t>()), shift, hist->data<int32_t>());
  return LastLaunchStatus("HistogramKernel");
}

Status QuantileThresholdsCuda(const Tensor& scores, const Tensor& bias, int64_t top_k,
                              bool exclusive, Tensor* thresholds) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(scores.device().index));
  const int64_t m = scores.dim(0), n = scores.dim(1);
  ORRERY_ASSIGN_OR_RETURN(Tensor margins, Tensor::Allocate({n, m}, DType::kF64, scores.device()));
  ORRERY_RETURN_IF_ERROR(LaunchMargins(ctx, scores, bias, top_k, exclusive, &margins));
  const double q = static_cast<double>(m * top_k) / static_cast<double>(n);
  const int64_t r = std::min<int64_t>(m - 1, static_cast<int64_t>(std::ceil(q)));
  SelectKernel<<<static_cast<unsigned>(n), kSelectThreads, 0, ctx->stream()>>>(
      margins.data<double>(), m, r, exclusive, thresholds->data<double>());
  return LastLaunchStatus("SelectKernel");
}

}  // namespace orrery::kernels::cuda
