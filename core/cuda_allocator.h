// The CUDA side of core/device.h. In builds without CUDA every function returns
// FailedPrecondition ("built without CUDA"), so CPU-only binaries still link and report clearly.
//
// One stream per device. Every op (kernels/cuda/device_context.h hands it to the kernels and
// cuBLASLt) and every copy and zeroing of core/device.h is queued on CudaStream(index), so all
// device work of one device runs in the order the host queued it. That order is what makes the
// caching allocator and the shared cuBLASLt workspace safe without events: a block freed by the
// host after queueing the kernels that use it is reused only by work queued later on the same
// stream. Why a dedicated stream and not the legacy default stream: a CUDA graph cannot be
// captured from the legacy stream (the decode step's graphs, core/cuda_graph.h). Why not
// per-thread default streams (nvcc --default-stream per-thread): two host threads driving one
// device (a learner and a rollout actor running as threads of one process) would get two streams,
// and the allocator and the workspace, which are per device, would then hand memory in use on
// one stream to the other. The stream is created blocking (not cudaStreamNonBlocking) on
// purpose: work some library queues on the legacy stream is still ordered with it, and such work
// during a graph capture fails the capture loudly instead of racing with it. The one exception,
// explicit and bounded: a SideStream body (core/cuda_side_stream.h) queues on the device's second
// stream, ordered with this one by events at its fork and join, its freed blocks held until the
// join; CudaStream, CudaCopy, CudaZero and CudaSynchronize then act on that stream.
//
// Copies (CudaCopy) return once the source may be reused:
//   device -> device: queued on the stream, no host wait.
//   host -> device: up to kStagingChunkBytes through a ring of pinned staging buffers, queued
//       without waiting for the device (a staging buffer is written again once its copy ran);
//       larger ones queued straight from the host memory (the driver stages pageable memory
//       before the call returns; a pinned source is waited for).
//   device -> host: queued, then the stream is synchronised (the caller reads the data next).
// A copy touching host memory while the stream is being captured into a graph is an error: a
// graph would replay it from a host buffer that has been reused since.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; core's headers do not include the runtime's

namespace orrery {

StatusOr<void*> CudaCachingAlloc(int device_index, size_t bytes);
void CudaCachingFree(int device_index, void* ptr, size_t bytes);
// Device indices are -1 for host memory.
Status CudaCopy(void* dst, int dst_device, const void* src, int src_device, size_t bytes);
Status CudaZero(int device_index, void* dst, size_t bytes);

// The stream of device `device_index` (created on first use, kept for the process's life).
StatusOr<CUstream_st*> CudaStream(int device_index);
// Waits for everything queued on the device's stream.
Status CudaSynchronize(int device_index);

inline constexpr size_t kStagingChunkBytes = size_t{256} << 10;
inline constexpr int kStagingBuffers = 64;

// Private pools of the device's caching allocator (core/block_cache.h), for CUDA graphs.
StatusOr<uint64_t> CudaCreatePrivatePool(int device_index);
Status CudaBeginPrivatePool(int device_index, uint64_t pool);
void CudaEndPrivatePool(int device_index);
void CudaReleasePrivatePool(int device_index, uint64_t pool);

}  // namespace orrery
