// The stable counting sort of the (token, slot) pairs by expert (kernels/moe.h MoeExpertsSaved):
// three launches over chunks of kChunk consecutive pairs, each chunk walked in order by one warp,
// 32 pairs a step.
//   CountKernel: the chunk's per-expert counts counts[c, e]; within a step the lanes of one expert
//                find each other with __match_any_sync and the lowest adds the group's size.
//   ScanKernel:  one block, a thread per expert: counts[c, e] becomes the exclusive prefix over
//                chunks plus the expert's start offsets[e] (a block scan of the totals), so it is
//                the first row of expert e that chunk c fills.
//   PlaceKernel: the walk again; a pair's row is its chunk's base for its expert plus the number
//                of earlier lanes of the step with the same expert, then the group's leader
//                advances the base. Rows follow p within each expert: the sort is stable.
// No global atomics decide an order, so perm and rank are deterministic. An id outside [0, E) is
// skipped and its p kept (atomicMin) in meta[E + 1], read back with the offsets.
// The offsets stay on the device for the grouped GEMMs (kernels/grouped_gemm.h); the read back
// of offsets and bad pair happens only for the per-expert loop (kernels/moe_op.cc).
#include <string>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/moe_cuda.h"
#include "kernels/moe.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kChunk = 1024, kWarps = 4, kThreads = 32 * kWarps, kScanThreads = 1024;
constexpr unsigned kFull = 0xffffffffu;
// Every byte of meta's bad-pair slot 0x7F: the int32 0x7F7F7F7F, above any pair index.
constexpr int kNoBadPairByte = 0x7F;
constexpr int32_t kNoBadPair = 0x7F7F7F7F;
static_assert(kMaxExperts <= kScanThreads, "ScanKernel has one thread per expert");

// The expert of pair p, or -1 past the end or for an id outside [0, e) (flagged in *bad).
__device__ __forceinline__ int ExpertOf(const int32_t* ids, int64_t p, int64_t m, int e, int* bad) {
  if (p >= m) return -1;
  const int id = ids[p];
  if (id < 0 || id >= e) {
    if (bad != nullptr) atomicMin(bad, static_cast<int>(p));  // an exact minimum: order-free
    return -1;
  }
  return id;
}

__global__ void CountKernel(const int32_t* __restrict__ ids, int64_t m, int e, int64_t chunks,
                            int32_t* __restrict__ counts, int* bad) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kWarps + warp; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * kWarps) {
    int32_t* base = counts + c * e;
    for (int64_t p0 = c * kChunk; p0 < m && p0 < (c + 1) * kChunk; p0 += 32) {
      const int id = ExpertOf(ids, p0 + lane, m, e, bad);
      const unsigned same = __match_any_sync(kFull, id);
      if (id >= 0 && lane == __ffs(same) - 1) base[id] += __popc(same);
      __syncwarp();
    }
  }
}

__global__ void ScanKernel(int64_t chunks, int e, int32_t* __restrict__ counts,
                           int32_t* __restrict__ offsets) {
  __shared__ int32_t scan[kScanThreads];
  const int x = threadIdx.x;
  int32_t total = 0;
  if (x < e) {
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t v = counts[c * e + x];
      counts[c * e + x] = total;
      total += v;
    }
  }
  scan[x] = total;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off <<= 1) {  // inclusive Hillis-Steele scan
    const int32_t add = x >= off ? scan[x - off] : 0;
    __syncthreads();
    scan[x] += add;
    __syncthreads();
  }
  const int32_t start = scan[x] - total;
  if (x < e) {
    offsets[x] = start;
    for (int64_t c = 0; c < chunks; ++c) counts[c * e + x] += start;
  }
  if (x == e - 1) offsets[e] = scan[x];
}

__global__ void PlaceKernel(const int32_t* __restrict__ ids, int64_t m, int e, int64_t chunks,
                            int32_t* __restrict__ counts, int32_t* __restrict__ perm,
                            int32_t* __restrict__ rank) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kWarps + warp; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * kWarps) {
    int32_t* base = counts + c * e;
    for (int64_t p0 = c * kChunk; p0 < m && p0 < (c + 1) * kChunk; p0 += 32) {
      const int64_t p = p0 + lane;
      const int id = ExpertOf(ids, p, m, e, nullptr);
      const unsigned same = __match_any_sync(kFull, id);
      if (id >= 0) {
        const int32_t row = base[id] + __popc(same & ((1u << lane) - 1u));
        perm[row] = static_cast<int32_t>(p);
        rank[p] = row;
      }
      __syncwarp();  // every lane has read the base before the leader advances it
      if (id >= 0 && lane == __ffs(same) - 1) base[id] += __popc(same);
      __syncwarp();
    }
  }
}

}  // namespace

Status MoePermuteCuda(const Tensor& ids, int64_t num_experts, Tensor* perm, Tensor* rank,
                      Tensor* offsets_device, std::vector<int64_t>* offsets, int64_t* bad_pair) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(ids.device().index));
  const cudaStream_t s = ctx->stream();
  const int64_t m = ids.numel(), chunks = (m + kChunk - 1) / kChunk;
  const int e = static_cast<int>(num_experts);
  ORRERY_ASSIGN_OR_RETURN(Tensor counts, Tensor::Allocate({chunks, e}, DType::kI32, ids.device()));
  // meta = offsets [E + 1] (written by ScanKernel), then the first bad pair (kNoBadPair: none).
  // Filled by a memset, not a host copy: a copy from pageable memory may synchronise the stream.
  ORRERY_ASSIGN_OR_RETURN(Tensor meta, Tensor::Allocate({e + 2}, DType::kI32, ids.device()));
  if (m >= kNoBadPair) {
    return InvalidArgumentError("moe_permute: " + std::to_string(m) +
                                " pairs, expected fewer than " + std::to_string(kNoBadPair));
  }
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), s), "moe_permute counts"));
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(meta.raw_data(), kNoBadPairByte, meta.nbytes(), s), "moe_permute meta"));
  if (offsets == nullptr) {  // unchecked ids: every perm and rank entry must stay in range
    ORRERY_RETURN_IF_ERROR(
        CudaStatus(cudaMemsetAsync(perm->raw_data(), 0, perm->nbytes(), s), "moe_permute perm"));
    ORRERY_RETURN_IF_ERROR(
        CudaStatus(cudaMemsetAsync(rank->raw_data(), 0, rank->nbytes(), s), "moe_permute rank"));
  }
  int32_t* meta_p = meta.data<int32_t>();
  const unsigned grid = GridFor(chunks, kWarps);
  CountKernel<<<grid, kThreads, 0, s>>>(ids.data<int32_t>(), m, e, chunks, counts.data<int32_t>(),
                                        meta_p + e + 1);
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("CountKernel"));
  ScanKernel<<<1, kScanThreads, 0, s>>>(chunks, e, counts.data<int32_t>(), meta_p);
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("ScanKernel"));
  PlaceKernel<<<grid, kThreads, 0, s>>>(ids.data<int32_t>(), m, e, chunks, counts.data<int32_t>(),
                                        perm->data<int32_t>(), rank->data<int32_t>());
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("PlaceKernel"));
  ORRERY_ASSIGN_OR_RETURN(*offsets_device, meta.Slice(0, e + 1));
  *bad_pair = -1;
  if (offsets == nullptr) return Status::OK();
  std::vector<int32_t> host(static_cast<size_t>(e + 2), 0);
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(host.data(), meta.raw_data(), meta.nbytes(), cudaMemcpyDeviceToHost, s),
      "moe_permute offsets"));
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), "moe_permute offsets"));
  *bad_pair = host[e + 1] == kNoBadPair ? -1 : host[e + 1];
  offsets->assign(host.begin(), host.begin() + e + 1);
  return Status::OK();
}

}  // namespace orrery::kernels::cuda
