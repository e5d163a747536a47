// Embedding gather and scatter-add (kernels/embedding.h). An out-of-range id is not read or
// written; the first such position is kept in a device flag (atomicMin: an exact integer minimum,
// the same whatever the order of the rows) that the op reads back once per call.
// Gather: one warp per token row, grid-stride over rows.
// Scatter-add, deterministic (the plan and its host twin: sorted_scatter_order.h): the rows'
// (id, position) pairs are sorted by id with CUB's stable radix sort, then pass 1 sums each run
// of equal ids of a chunk of kScatterChunk sorted entries in entry order, per column (a thread per
// column, eight rows' loads in flight), and writes a whole segment's sum into its table row and a
// chunk-crossing run's into the chunk's slot; pass 2 adds each crossing segment's slots in chunk
// order into its row. Every table row has one writer: the same inputs give the same bits on every
// run (the atomic version's last bits depended on the order of rows of one id).
// Not yet timed: a sort of n keys of log2(vocab) bits, one pass over dy and a pass over the
// chunks' slots, against the atomic version's one pass.
#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/sorted_scatter_order.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

template <typename T>
__global__ void GatherKernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                             int64_t n, int64_t vocab, int64_t d, T* __restrict__ y, int* bad) {
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < n;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab) {
      if (lane == 0) atomicMin(bad, static_cast<int>(r));  // an exact minimum: order-free
      continue;
    }
    const T* src = table + static_cast<int64_t>(id) * d;
    T* dst = y + r * d;
    for (int64_t i = lane; i < d; i += 32) dst[i] = src[i];
  }
}

// keys[r] = ids[r] inside [0, vocab), else vocab (sorted last, skipped); positions[r] = r.
__global__ void ScatterKeysKernel(const int32_t* __restrict__ ids, int64_t n, int64_t vocab,
                                  int32_t* __restrict__ keys, int32_t* __restrict__ positions,
                                  int* bad) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = ids[r];
    const bool in = id >= 0 && id < vocab;
    if (!in) atomicMin(bad, static_cast<int>(r));  // an exact minimum: order-free
    keys[r] = in ? id : static_cast<int32_t>(vocab);
    positions[r] = static_cast<int32_t>(r);
  }
}

constexpr int kScatterThreads = 256;
constexpr int kInFlight = 8;  // rows whose loads a thread issues before it adds them

// Pass 1, a block per chunk of sorted entries, a thread per column (strided).
template <typename T>
__global__ void __launch_bounds__(kScatterThreads)
    ScatterRunsKernel(const int32_t* __restrict__ keys, const int32_t* __restrict__ positions,
                      const T* __restrict__ dy, int64_t n, int64_t vocab, int64_t d,
                      float* __restrict__ dtable, float* __restrict__ first_slot,
                      float* __restrict__ last_slot) {
  __shared__ int32_t pos[kScatterChunk];
  __shared__ bool run_end[kScatterChunk];  // entry e is the last of its run in the chunk
  const int64_t k = blockIdx.x;
  const int64_t begin = ScatterChunkBegin(k), end = ScatterChunkEnd(n, k);
  const int len = static_cast<int>(end - begin);
  if (threadIdx.x < len) {
    const int64_t e = begin + threadIdx.x;
    pos[threadIdx.x] = positions[e];
    run_end[threadIdx.x] = e + 1 == end || keys[e + 1] != keys[e];
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += kScatterThreads) {
    float acc = 0.0f;
    int s = 0;
    for (int e0 = 0; e0 < len; e0 += kInFlight) {
      float v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        v[u] = e0 + u < len ? ToF(dy[static_cast<int64_t>(pos[e0 + u]) * d + c]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int e = e0 + u;
        if (e >= len) break;
        acc += v[u];
        if (!run_end[e]) continue;
        const int32_t key = keys[begin + e];
        if (key < vocab) {
          switch (RunDestination(keys, n, begin + s, begin + e + 1)) {
            case kScatterTable:
              dtable[static_cast<int64_t>(key) * d + c] += acc;
              break;
            case kScatterFirstSlot:
              first_slot[k * d + c] = acc;
              break;
            case kScatterLastSlot:
              last_slot[k * d + c] = acc;
              break;
          }
        }
        acc = 0.0f;
        s = e + 1;
      }
    }
  }
}

// Pass 2, a block per chunk: the owner of a segment crossing chunk ends adds its slots in order.
__global__ void __launch_bounds__(kScatterThreads)
    ScatterSpanningKernel(const int32_t* __restrict__ keys, int64_t n, int64_t vocab, int64_t d,
                          const float* __restrict__ first_slot, const float* __restrict__ last_slot,
                          float* __restrict__ dtable) {
  const int64_t k = blockIdx.x;
  if (!ChunkOwnsSpanningSegment(keys, n, k)) return;
  const int32_t key = keys[ScatterChunkEnd(n, k) - 1];
  if (key >= vocab) return;
  for (int64_t c = threadIdx.x; c < d; c += kScatterThreads) {
    float total = last_slot[k * d + c];
    int64_t j = k + 1;
    total += first_slot[j * d + c];
    while (SegmentContinuesPast(keys, n, j)) {
      ++j;
      total += first_slot[j * d + c];
    }
    dtable[static_cast<int64_t>(key) * d + c] += total;
  }
}

// The flag's first bad position, or OK.
Status CheckFlag(const char* op, const Tensor& flag, const Tensor& ids, int64_t vocab,
                 cudaStream_t s) {
  int pos = INT_MAX;
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&pos, flag.raw_data(), sizeof(int), cudaMemcpyDeviceToHost, s), op));
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), op));
  if (pos == INT_MAX) return Status::OK();
  int32_t id = 0;
  ORRERY_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(&id, ids.data<int32_t>() + pos, sizeof(int32_t), cudaMemcpyDeviceToHost), op));
  return OutOfRangeError(std::string(op) + ": ids[" + std::to_string(pos) + "] = " +
                         std::to_string(id) + ", expected [0, " + std::to_string(vocab) + ")");
}

StatusOr<Tensor> NewFlag(Device device, cudaStream_t s) {
  ORRERY_ASSIGN_OR_RETURN(Tensor flag, Tensor::Allocate({1}, DType::kI32, device));
  const int init = INT_MAX;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(flag.raw_data(), &init, sizeof(int), cudaMemcpyHostToDevice, s),
                 "embedding flag"));
  return flag;
}

}  // namespace

Status EmbeddingGatherCuda(const Tensor& table, const Tensor& ids, Tensor* y) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(table.device().index));
  ORRERY_ASSIGN_OR_RETURN(Tensor flag, NewFlag(table.device(), ctx->stream()));
  const int64_t n = ids.numel(), v = table.dim(0), d = table.dim(1);
  const unsigned grid = GridFor(n, kWarps);
  if (table.dtype() == DType::kBF16) {
    GatherKernel<__nv_bfloat16><<<grid, kThreads, 0, ctx->stream()>>>(
        static_cast<const __nv_bfloat16*>(table.raw_data()), ids.data<int32_t>(), n, v, d,
        static_cast<__nv_bfloat16*>(y->raw_data()), flag.data<int32_t>());
  } else {
    GatherKernel<float><<<grid, kThreads, 0, ctx->stream()>>>(
        table.data<float>(), ids.data<int32_t>(), n, v, d, y->data<float>(), flag.data<int32_t>());
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("GatherKernel"));
  return CheckFlag("embedding", flag, ids, v, ctx->stream());
}

Status EmbeddingScatterAddCuda(const Tensor& ids, const Tensor& dy, Tensor* dtable) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(dy.device().index));
  const Device dev = dy.device();
  cudaStream_t s = ctx->stream();
  ORRERY_ASSIGN_OR_RETURN(Tensor flag, NewFlag(dev, s));
  const int64_t n = ids.numel(), v = dtable->dim(0), d = dtable->dim(1);
  if (n > INT_MAX) {
    return InvalidArgumentError("embedding_backward: " + std::to_string(n) +
                                " ids, at most 2^31 - 1 per call");
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor pairs, Tensor::Allocate({4, n}, DType::kI32, dev));
  int32_t* keys_in = pairs.data<int32_t>();
  int32_t* keys = keys_in + n;
  int32_t* pos_in = keys + n;
  int32_t* pos = pos_in + n;
  ScatterKeysKernel<<<GridFor(n, kScatterThreads), kScatterThreads, 0, s>>>(
      ids.data<int32_t>(), n, v, keys_in, pos_in, flag.data<int32_t>());
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("ScatterKeysKernel"));
  const int bits = ScatterKeyBits(v);
  size_t temp_bytes = 0;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys, pos_in, pos,
                                                 static_cast<int>(n), 0, bits, s),
                 "embedding_backward sort size"));
  ORRERY_ASSIGN_OR_RETURN(
      Tensor temp,
      Tensor::Allocate({std::max<int64_t>((temp_bytes + 7) / 8, 1)}, DType::kI64, dev));
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys, pos_in,
                                                 pos, static_cast<int>(n), 0, bits, s),
                 "embedding_backward sort"));
  const int64_t chunks = (n + kScatterChunk - 1) / kScatterChunk;
  ORRERY_ASSIGN_OR_RETURN(Tensor slots, Tensor::Allocate({2, chunks, d}, DType::kF32, dev));
  float* first = slots.data<float>();
  float* last = first + chunks * d;
  const unsigned grid = static_cast<unsigned>(chunks);
  if (dy.dtype() == DType::kBF16) {
    ScatterRunsKernel<__nv_bfloat16><<<grid, kScatterThreads, 0, s>>>(
        keys, pos, static_cast<const __nv_bfloat16*>(dy.raw_data()), n, v, d, dtable->data<float>(),
        first, last);
  } else {
    ScatterRunsKernel<float><<<grid, kScatterThreads, 0, s>>>(keys, pos, dy.data<float>(), n, v, d,
                                                              dtable->data<float>(), first, last);
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("ScatterRunsKernel"));
  ScatterSpanningKernel<<<grid, kScatterThreads, 0, s>>>(keys, n, v, d, first, last,
                                                         dtable->data<float>());
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("ScatterSpanningKernel"));
  return CheckFlag("embedding_backward", flag, ids, v, s);
}

}  // namespace orrery::kernels::cuda
