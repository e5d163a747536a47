// CUDA build: one BlockCache per device around cudaMalloc/cudaFree, one stream per device and the
// pinned staging ring of host-to-device copies (core/cuda_allocator.h), and the device's side
// stream (core/cuda_side_stream.h).
#include "core/cuda_allocator.h"

#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/block_cache.h"
#include "core/cuda_side_stream.h"

namespace orrery {
namespace {

constexpr int kMaxDevices = 64;

Status CudaError(const char* what, cudaError_t err) {
  return InternalError(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                       cudaGetErrorString(err));
}

Status Check(cudaError_t err, const char* what) {
  return err == cudaSuccess ? Status::OK() : CudaError(what, err);
}

Status NoDevice(int device_index) {
  return FailedPreconditionError("no CUDA device " + std::to_string(device_index) + " (" +
                                 std::to_string(CudaDeviceCount()) + " visible)");
}

bool ValidIndex(int device_index) {
  return device_index >= 0 && device_index < std::min(kMaxDevices, CudaDeviceCount());
}

// Makes `device_index` current for this thread (a no-op when it already is).
Status UseDevice(int device_index) {
  int current = -1;
  ORRERY_RETURN_IF_ERROR(Check(cudaGetDevice(&current), "cudaGetDevice"));
  if (current == device_index) return Status::OK();
  return Check(cudaSetDevice(device_index), "cudaSetDevice");
}

BlockCache* CacheFor(int device_index) {
  static std::array<std::unique_ptr<BlockCache>, kMaxDevices> caches;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& cache = caches[device_index];
  if (!cache) {
    cache = std::make_unique<BlockCache>(
        [device_index](size_t bytes) -> void* {
          void* p = nullptr;
          cudaSetDevice(device_index);
          if (cudaMalloc(&p, bytes) != cudaSuccess) {
            cudaGetLastError();  // clear the sticky-free error state of a failed malloc
            return nullptr;
          }
          return p;
        },
        [device_index](void* p) {
          cudaSetDevice(device_index);
          cudaFree(p);
        });
  }
  return cache.get();
}

// The device's stream and its staging ring; its side stream, made at the first SideStream::Run,
// with the events of a fork and a join and the blocks freed by side work, held until a Join.
struct DeviceQueue {
  cudaStream_t stream = nullptr;
  std::mutex staging_mu;
  char* staging = nullptr;  // kStagingBuffers * kStagingChunkBytes pinned bytes
  std::array<cudaEvent_t, kStagingBuffers> copied{};
  int next = 0;
  std::mutex side_mu;
  cudaStream_t side = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;
  std::vector<std::pair<void*, size_t>> held;
};

// The device whose side stream this thread queues on (inside a SideStream body), else -1.
thread_local int side_device = -1;

// The stream this thread queues device `device_index`'s work on.
cudaStream_t Lane(const DeviceQueue* q, int device_index) {
  return side_device == device_index ? q->side : q->stream;
}

StatusOr<DeviceQueue*> QueueFor(int device_index) {
  if (!ValidIndex(device_index)) return NoDevice(device_index);
  static std::array<std::unique_ptr<DeviceQueue>, kMaxDevices> queues;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& q = queues[device_index];
  if (q) return q.get();
  auto made = std::make_unique<DeviceQueue>();
  ORRERY_RETURN_IF_ERROR(UseDevice(device_index));
  // Blocking on purpose (see the header): ordered with any work on the legacy stream.
  ORRERY_RETURN_IF_ERROR(Check(cudaStreamCreate(&made->stream), "cudaStreamCreate"));
  q = std::move(made);
  return q.get();
}

// Whether the stream is being captured into a graph now.
StatusOr<bool> Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ORRERY_RETURN_IF_ERROR(Check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing"));
  return status != cudaStreamCaptureStatusNone;
}

// Host -> device through the staging ring (bytes <= kStagingChunkBytes), queued on `stream`.
Status StagedUpload(DeviceQueue* q, cudaStream_t stream, void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(q->staging_mu);
  if (q->staging == nullptr) {
    void* p = nullptr;
    ORRERY_RETURN_IF_ERROR(
        Check(cudaMallocHost(&p, kStagingChunkBytes * kStagingBuffers), "cudaMallocHost(staging)"));
    q->staging = static_cast<char*>(p);
    for (cudaEvent_t& e : q->copied) {
      ORRERY_RETURN_IF_ERROR(
          Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate(staging)"));
      ORRERY_RETURN_IF_ERROR(Check(cudaEventRecord(e, stream), "cudaEventRecord(staging)"));
    }
  }
  const int slot = q->next;
  q->next = (q->next + 1) % kStagingBuffers;
  // The buffer's previous copy must have run before it is written again.
  ORRERY_RETURN_IF_ERROR(Check(cudaEventSynchronize(q->copied[slot]), "staging event"));
  char* buffer = q->staging + static_cast<size_t>(slot) * kStagingChunkBytes;
  std::memcpy(buffer, src, bytes);
  ORRERY_RETURN_IF_ERROR(Check(cudaMemcpyAsync(dst, buffer, bytes, cudaMemcpyHostToDevice, stream),
                               "cudaMemcpyAsync(host to device)"));
  return Check(cudaEventRecord(q->copied[slot], stream), "cudaEventRecord(staging)");
}

// Whether host memory at p is pinned (page-locked or registered).
bool Pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

}  // namespace

bool CudaCompiledIn() { return true; }

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

StatusOr<void*> CudaCachingAlloc(int device_index, size_t bytes) {
  if (!ValidIndex(device_index)) return NoDevice(device_index);
  void* p = CacheFor(device_index)->Allocate(bytes);
  if (p == nullptr) {
    return ResourceExhaustedError("out of memory on cuda:" + std::to_string(device_index) +
                                  " allocating " + std::to_string(bytes) + " bytes");
  }
  return p;
}

void CudaCachingFree(int device_index, void* ptr, size_t bytes) {
  if (side_device == device_index) {
    StatusOr<DeviceQueue*> q = QueueFor(device_index);
    if (q.ok()) {
      std::lock_guard<std::mutex> lock((*q)->side_mu);
      (*q)->held.emplace_back(ptr, bytes);
      return;
    }
  }
  CacheFor(device_index)->Free(ptr, bytes);
}

StatusOr<CUstream_st*> CudaStream(int device_index) {
  ORRERY_ASSIGN_OR_RETURN(DeviceQueue * q, QueueFor(device_index));
  return Lane(q, device_index);
}

Status CudaSynchronize(int device_index) {
  ORRERY_ASSIGN_OR_RETURN(DeviceQueue * q, QueueFor(device_index));
  return Check(cudaStreamSynchronize(Lane(q, device_index)), "cudaStreamSynchronize");
}

Status CudaCopy(void* dst, int dst_device, const void* src, int src_device, size_t bytes) {
  if (bytes == 0) return Status::OK();
  if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
    // Between devices (rare): both streams drained, then a copy waited for.
    ORRERY_RETURN_IF_ERROR(CudaSynchronize(src_device));
    ORRERY_ASSIGN_OR_RETURN(DeviceQueue * q, QueueFor(dst_device));
    ORRERY_RETURN_IF_ERROR(UseDevice(dst_device));
    const cudaStream_t stream = Lane(q, dst_device);
    ORRERY_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync"));
    return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  const int device = dst_device >= 0 ? dst_device : src_device;
  ORRERY_ASSIGN_OR_RETURN(DeviceQueue * q, QueueFor(device));
  ORRERY_RETURN_IF_ERROR(UseDevice(device));
  const cudaStream_t stream = Lane(q, device);
  if (dst_device >= 0 && src_device >= 0) {
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync(device to device)");
  }
  ORRERY_ASSIGN_OR_RETURN(const bool capturing, Capturing(stream));
  if (capturing) {
    return FailedPreconditionError(
        "cuda copy: a copy between host and device while the stream is captured into a graph "
        "(the graph would replay it from a host buffer reused since)");
  }
  if (src_device < 0) {  // host -> device
    if (bytes <= kStagingChunkBytes) return StagedUpload(q, stream, dst, src, bytes);
    ORRERY_RETURN_IF_ERROR(Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                                 "cudaMemcpyAsync(host to device)"));
    if (Pinned(src)) return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return Status::OK();
  }
  ORRERY_RETURN_IF_ERROR(Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                               "cudaMemcpyAsync(device to host)"));
  return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

Status CudaZero(int device_index, void* dst, size_t bytes) {
  ORRERY_ASSIGN_OR_RETURN(DeviceQueue * q, QueueFor(device_index));
  ORRERY_RETURN_IF_ERROR(UseDevice(device_index));
  return Check(cudaMemsetAsync(dst, 0, bytes, Lane(q, device_index)), "cudaMemsetAsync");
}

CachingAllocatorStats GetCachingAllocatorStats(int device_index) {
  if (device_index < 0 || device_index >= kMaxDevices) return {};
  BlockCache::Stats s = CacheFor(device_index)->stats();
  return {s.bytes_in_use, s.bytes_cached, s.peak_bytes_in_use, s.fresh_allocs, s.cache_hits};
}

void ReleaseCachedDeviceMemory(int device_index) {
  if (device_index >= 0 && device_index < kMaxDevices) CacheFor(device_index)->ReleaseCached();
}

void ResetCachingAllocatorPeak(int device_index) {
  if (device_index >= 0 && device_index < kMaxDevices) CacheFor(device_index)->ResetPeak();
}

int64_t DeviceBytesAvailable(Device device) {
  if (!device.is_cuda() || device.index < 0 ||
      device.index >= std::min(kMaxDevices, CudaDeviceCount())) {
    return 0;
  }
  size_t free_bytes = 0, total = 0;
  cudaSetDevice(device.index);
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(free_bytes + CacheFor(device.index)->stats().bytes_cached);
}

StatusOr<uint64_t> CudaCreatePrivatePool(int device_index) {
  if (!ValidIndex(device_index)) return NoDevice(device_index);
  return CacheFor(device_index)->CreatePool();
}

Status CudaBeginPrivatePool(int device_index, uint64_t pool) {
  if (!ValidIndex(device_index)) return NoDevice(device_index);
  if (!CacheFor(device_index)->BeginPool(pool)) {
    return FailedPreconditionError("cuda allocator: private pool " + std::to_string(pool) +
                                   " cannot begin (another pool is active, or it was released)");
  }
  return Status::OK();
}

void CudaEndPrivatePool(int device_index) {
  if (device_index >= 0 && device_index < kMaxDevices) CacheFor(device_index)->EndPool();
}

void CudaReleasePrivatePool(int device_index, uint64_t pool) {
  if (device_index >= 0 && device_index < kMaxDevices) CacheFor(device_index)->ReleasePool(pool);
}

}  // namespace orrery

namespace orrery {
namespace {

// ORRERY_SIDE_STREAM: unset or "1" overlaps, "0" runs side work on the device's stream.
StatusOr<bool> SideStreamsEnabled() {
  const char* env = std::getenv("ORRERY_SIDE_STREAM");
  if (env == nullptr || std::strcmp(env, "1") == 0) return true;
  if (std::strcmp(env, "0") == 0) return false;
  return InvalidArgumentError(std::string("ORRERY_SIDE_STREAM='") + env +
                              "', expected 0 (no overlap) or 1 (the default)");
}

// Makes the device's side stream and its events once.
Status MakeSideStream(DeviceQueue* q) {
  std::lock_guard<std::mutex> lock(q->side_mu);
  if (q->side != nullptr) return Status::OK();
  // Blocking, as the device's stream is (core/cuda_allocator.h).
  ORRERY_RETURN_IF_ERROR(Check(cudaStreamCreate(&q->side), "cudaStreamCreate(side)"));
  ORRERY_RETURN_IF_ERROR(
      Check(cudaEventCreateWithFlags(&q->forked, cudaEventDisableTiming), "cudaEventCreate(fork)"));
  return Check(cudaEventCreateWithFlags(&q->joined, cudaEventDisableTiming),
               "cudaEventCreate(join)");
}

}  // namespace

SideStream::~SideStream() {
  // A Join left to the destructor is an error path's: that error is the one reported; a failure
  // of the wait itself drained the side stream (Join), so nothing stays unordered.
  (void)Join();
}

Status SideStream::Run(Device device, const std::function<Status()>& body) {
  ORRERY_RETURN_IF_ERROR(Join());  // a Run before the last one's Join joins it first
  overlapped_ = false;
  ORRERY_ASSIGN_OR_RETURN(const bool enabled, SideStreamsEnabled());
  if (!device.is_cuda() || !enabled || side_device >= 0) return body();
  ORRERY_ASSIGN_OR_RETURN(DeviceQueue * q, QueueFor(device.index));
  ORRERY_ASSIGN_OR_RETURN(const bool capturing, Capturing(q->stream));
  if (capturing) return body();
  ORRERY_RETURN_IF_ERROR(UseDevice(device.index));
  ORRERY_RETURN_IF_ERROR(MakeSideStream(q));
  ORRERY_RETURN_IF_ERROR(Check(cudaEventRecord(q->forked, q->stream), "cudaEventRecord(fork)"));
  ORRERY_RETURN_IF_ERROR(
      Check(cudaStreamWaitEvent(q->side, q->forked, 0), "cudaStreamWaitEvent(fork)"));
  device_index_ = device.index;
  overlapped_ = true;
  side_device = device.index;
  const Status st = body();
  side_device = -1;
  if (!st.ok()) {
    (void)Join();  // the body's error is the one to report
    return st;
  }
  return Status::OK();
}

Status SideStream::Join() {
  if (device_index_ < 0) return Status::OK();
  const int device_index = device_index_;
  device_index_ = -1;
  ORRERY_ASSIGN_OR_RETURN(DeviceQueue * q, QueueFor(device_index));
  ORRERY_RETURN_IF_ERROR(UseDevice(device_index));
  Status st = Check(cudaEventRecord(q->joined, q->side), "cudaEventRecord(join)");
  if (st.ok()) {
    st = Check(cudaStreamWaitEvent(q->stream, q->joined, 0), "cudaStreamWaitEvent(join)");
  }
  // Without the wait queued, the held blocks are safe to reuse only once the side work ran.
  if (!st.ok()) cudaStreamSynchronize(q->side);
  std::vector<std::pair<void*, size_t>> held;
  {
    std::lock_guard<std::mutex> lock(q->side_mu);
    held.swap(q->held);
  }
  for (const auto& [ptr, bytes] : held) CacheFor(device_index)->Free(ptr, bytes);
  return st;
}

bool InSideStream(int device_index) { return device_index >= 0 && side_device == device_index; }

}  // namespace orrery
