// CUDA build: one BlockCache per device around cudaMalloc/cudaFree.
#include "core/cuda_allocator.h"

#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "core/block_cache.h"

namespace orrery {
namespace {

constexpr int kMaxDevices = 64;

Status CudaError(const char* what, cudaError_t err) {
  return InternalError(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                       cudaGetErrorString(err));
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
  if (device_index < 0 || device_index >= std::min(kMaxDevices, CudaDeviceCount())) {
    return FailedPreconditionError("no CUDA device " + std::to_string(device_index) + " (" +
                                   std::to_string(CudaDeviceCount()) + " visible)");
  }
  void* p = CacheFor(device_index)->Allocate(bytes);
  if (p == nullptr) {
    return ResourceExhaustedError("out of memory on cuda:" + std::to_string(device_index) +
                                  " allocating " + std::to_string(bytes) + " bytes");
  }
  return p;
}

void CudaCachingFree(int device_index, void* ptr, size_t bytes) {
  CacheFor(device_index)->Free(ptr, bytes);
}

Status CudaCopy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing resolves the direction
  (void)dst_on_device;
  (void)src_on_device;
  cudaError_t err = cudaMemcpy(dst, src, bytes, kind);
  if (err != cudaSuccess) return CudaError("cudaMemcpy", err);
  return Status::OK();
}

Status CudaZero(int device_index, void* dst, size_t bytes) {
  cudaSetDevice(device_index);
  cudaError_t err = cudaMemset(dst, 0, bytes);
  if (err != cudaSuccess) return CudaError("cudaMemset", err);
  return Status::OK();
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

}  // namespace orrery
