// SampleTokens on the GPU (kernels/token_sampling.h): one block of kThreads per row.
//
//   1. max z and its lowest id: per-thread strided maxima, a block reduction (larger value, then
//      lower id);
//   2. p_j = exp((z_j - m) / t) in f64 into a scratch row, the sum as per-thread sums over
//      contiguous chunks of the row and an exclusive block scan of them (so a thread knows the
//      mass before its chunk: the id-order draw of top_p = 1 is then one pass);
//   3. top_p < 1: the radix descent of kernels/cpu/token_sampling.h, 16 levels of 4-bit digits:
//      per level each thread bins its strided candidates (16 masses, 16 counts in registers),
//      warps reduce them by shuffles, 16 threads add the warps' partials in a fixed order and
//      one thread takes SampleChooseDigit's decision (the CPU twin's code). Twice: the nucleus's
//      cut, then the draw's crossing among the nucleus. Ties at the final value are taken in id
//      order by a block scan of per-chunk counts.
// Every reduction has a fixed order, so a row's draw does not change from run to run. The rows
// are independent blocks; the scratch is [N, V] f64 (L2-resident at decode batch sizes).
// Not yet timed.
#include <cfloat>
#include <climits>

#include "kernels/cpu/token_sampling.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

using cpu::kSampleDigitBits;
using cpu::kSampleDigits;
using cpu::kSampleLevels;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

struct Shared {
  double mass[kWarps][kSampleDigits];
  int64_t count[kWarps][kSampleDigits];
  double total_mass[kSampleDigits];
  int64_t total_count[kSampleDigits];
  double warp_d[kWarps];
  int64_t warp_i[kWarps];
  float best[kWarps];
  int best_id[kWarps];
  // Broadcasts.
  double d0, d1;
  int64_t i0;
  int digit;
  bool passed;
};

__device__ __forceinline__ uint64_t Key(double x) {
  return static_cast<uint64_t>(__double_as_longlong(x));
}
__device__ __forceinline__ double Value(uint64_t key) {
  return __longlong_as_double(static_cast<long long>(key));
}

// Exclusive scan of one value per thread over the block, in thread order; *total gets the sum.
template <typename T>
__device__ T BlockExclusiveScan(T x, T* warp_partial, T* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  T incl = x;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  __syncthreads();
  if (lane == 31) warp_partial[warp] = incl;
  __syncthreads();
  T before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) before = all;
    all += warp_partial[w];
  }
  *total = all;
  return before + incl - x;
}

// One descent (kernels/cpu/token_sampling.h, SampleFindCut) over the row's p with block
// reductions. Candidates: keys > floor (every key without a floor).
__device__ cpu::SampleCut FindCut(const double* p, int64_t v, double bound, bool has_floor,
                                  uint64_t floor, bool lowest, Shared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  cpu::SampleCut cut;
  uint64_t prefix = 0, mask = 0;
  double above = 0;
  for (int level = 0; level < kSampleLevels; ++level) {
    const int shift = 64 - kSampleDigitBits * (level + 1);
    double mass[kSampleDigits];
    int64_t count[kSampleDigits];
#pragma unroll
    for (int d = 0; d < kSampleDigits; ++d) {
      mass[d] = 0.0;
      count[d] = 0;
    }
    for (int64_t j = threadIdx.x; j < v; j += kThreads) {
      const double pj = p[j];
      const uint64_t key = Key(pj);
      if ((has_floor && key <= floor) || (key & mask) != prefix) continue;
      const int dj = static_cast<int>((key >> shift) & (kSampleDigits - 1));
#pragma unroll
      for (int d = 0; d < kSampleDigits; ++d) {  // registers: no dynamic indexing
        if (d == dj) {
          mass[d] += pj;
          ++count[d];
        }
      }
    }
#pragma unroll
    for (int d = 0; d < kSampleDigits; ++d) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        mass[d] += __shfl_down_sync(0xffffffffu, mass[d], off);
        count[d] += __shfl_down_sync(0xffffffffu, count[d], off);
      }
      if (lane == 0) {
        sh.mass[warp][d] = mass[d];
        sh.count[warp][d] = count[d];
      }
    }
    __syncthreads();
    if (threadIdx.x < kSampleDigits) {
      const int d = threadIdx.x;
      double m = 0.0;
      int64_t c = 0;
      for (int w = 0; w < kWarps; ++w) {
        m += sh.mass[w][d];
        c += sh.count[w][d];
      }
      sh.total_mass[d] = m;
      sh.total_count[d] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double a = above;
      const cpu::SampleDigit d =
          cpu::SampleChooseDigit(sh.total_mass, sh.total_count, bound, lowest, &a);
      sh.digit = d.digit;
      sh.passed = d.passed;
      sh.d0 = a;
      sh.i0 = d.digit >= 0 ? sh.total_count[d.digit] : 0;
    }
    __syncthreads();
    const int digit = sh.digit;
    const bool passed = sh.passed;
    above = sh.d0;
    cut.count = sh.i0;
    __syncthreads();  // sh is written again by the next level
    if (digit < 0 || (level == 0 && !passed && !lowest)) return cpu::SampleCut{};
    prefix |= static_cast<uint64_t>(digit) << shift;
    mask |= static_cast<uint64_t>(kSampleDigits - 1) << shift;
  }
  cut.found = true;
  cut.key = prefix;
  cut.mass_above = above;
  return cut;
}

// The id of the j-th (1-based) position, in id order, whose p has `key` (every thread gets it).
__device__ int NthWithKey(const double* p, int64_t v, int64_t chunk, uint64_t key, int64_t j,
                          Shared& sh) {
  const int64_t begin = threadIdx.x * chunk, end = min(v, begin + chunk);
  int64_t mine = 0;
  for (int64_t i = begin; i < end; ++i) mine += Key(p[i]) == key;
  int64_t total = 0;
  const int64_t before = BlockExclusiveScan<int64_t>(mine, sh.warp_i, &total);
  if (threadIdx.x == 0) sh.i0 = -1;
  __syncthreads();
  if (before < j && j <= before + mine) {
    int64_t seen = before;
    for (int64_t i = begin; i < end; ++i) {
      if (Key(p[i]) == key && ++seen == j) {
        sh.i0 = i;
        break;
      }
    }
  }
  __syncthreads();
  const int64_t id = sh.i0;
  __syncthreads();
  return static_cast<int>(id);
}

__global__ void __launch_bounds__(kThreads)
    SampleTokensKernel(const float* __restrict__ logits, const double* __restrict__ params,
                       int64_t v, double* __restrict__ scratch, int32_t* __restrict__ ids,
                       float* __restrict__ logprobs) {
  __shared__ Shared sh;
  const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* z = logits + static_cast<int64_t>(row) * v;
  double* p = scratch + static_cast<int64_t>(row) * v;
  const double temperature = params[row * 3], top_p = params[row * 3 + 1], u = params[row * 3 + 2];
  // 1. The maximum and its lowest id.
  float best = -FLT_MAX;
  int best_id = INT_MAX;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) {
    if (z[j] > best || best_id == INT_MAX) {
      best = z[j];
      best_id = static_cast<int>(j);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ob = __shfl_down_sync(0xffffffffu, best, off);
    const int oi = __shfl_down_sync(0xffffffffu, best_id, off);
    if (oi != INT_MAX && (best_id == INT_MAX || ob > best || (ob == best && oi < best_id))) {
      best = ob;
      best_id = oi;
    }
  }
  if (lane == 0) {
    sh.best[warp] = best;
    sh.best_id[warp] = best_id;
  }
  __syncthreads();
  best = sh.best[0];
  best_id = sh.best_id[0];
  for (int w = 1; w < kWarps; ++w) {
    const float ob = sh.best[w];
    const int oi = sh.best_id[w];
    if (oi != INT_MAX && (best_id == INT_MAX || ob > best || (ob == best && oi < best_id))) {
      best = ob;
      best_id = oi;
    }
  }
  const double mx = best, t = temperature > 0 ? temperature : 1.0;
  // 2. p over contiguous chunks, their sums scanned.
  const int64_t chunk = (v + kThreads - 1) / kThreads;
  const int64_t begin = threadIdx.x * chunk, end = min(v, begin + chunk);
  double mine = 0.0;
  for (int64_t j = begin; j < end; ++j) {
    const double pj = exp((static_cast<double>(z[j]) - mx) / t);
    p[j] = pj;
    mine += pj;
  }
  double sum = 0.0;
  const double before = BlockExclusiveScan<double>(mine, sh.warp_d, &sum);
  __syncthreads();  // p visible to the block
  const double log_sum = log(sum);
  int id = best_id;
  if (temperature != 0.0) {
    if (!(top_p < 1.0)) {  // the first id, in id order, reaching u * sum
      const double target = u * sum;
      if (threadIdx.x == 0) sh.i0 = v - 1;
      __syncthreads();
      double acc = before;
      for (int64_t j = begin; j < end; ++j) {
        acc += p[j];
        if (acc >= target) {
          atomicMin(reinterpret_cast<unsigned long long*>(&sh.i0),
                    static_cast<unsigned long long>(j));
          break;
        }
      }
      __syncthreads();
      id = static_cast<int>(sh.i0);
    } else {
      const double bound = top_p * sum;
      cpu::SampleCut cut = FindCut(p, v, bound, false, 0, false, sh);
      int64_t r = 0;
      if (cut.found) {
        r = cpu::SampleTiesNeeded(cut.mass_above, Value(cut.key), cut.count, bound);
      } else {
        cut = FindCut(p, v, 0.0, false, 0, true, sh);
        r = cut.count;
      }
      const double c = Value(cut.key);
      const double target = u * (cut.mass_above + static_cast<double>(r) * c);
      const cpu::SampleCut cross = FindCut(p, v, target, true, cut.key, false, sh);
      if (cross.found) {
        const int64_t j =
            cpu::SampleTiesNeeded(cross.mass_above, Value(cross.key), cross.count, target);
        id = NthWithKey(p, v, chunk, cross.key, j, sh);
      } else {
        id = NthWithKey(p, v, chunk, cut.key, cpu::SampleTiesNeeded(cut.mass_above, c, r, target),
                        sh);
      }
    }
  }
  if (threadIdx.x == 0) {
    ids[row] = id;
    logprobs[row] = static_cast<float>((static_cast<double>(z[id]) - mx) / t - log_sum);
  }
}

}  // namespace

Status SampleTokensCuda(const Tensor& logits, const Tensor& params, Tensor* ids, Tensor* logprobs) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(logits.device().index));
  const int64_t n = logits.dim(0), v = logits.dim(1);
  if (v > INT_MAX) return InvalidArgumentError("sample_tokens: a vocabulary over 2^31 ids");
  ORRERY_ASSIGN_OR_RETURN(Tensor scratch, Tensor::Allocate({n, v}, DType::kF64, logits.device()));
  SampleTokensKernel<<<static_cast<unsigned>(n), kThreads, 0, ctx->stream()>>>(
      logits.data<float>(), params.data<double>(), v, scratch.data<double>(), ids->data<int32_t>(),
      logprobs->data<float>());
  return LastLaunchStatus("SampleTokensKernel");
}

}  // namespace orrery::kernels::cuda
