// Where a tensor's bytes live, and the allocators that provide them.
//
// CPU memory comes from aligned operator new. CUDA memory (only in builds with ORRERY_WITH_CUDA)
// comes from a caching allocator per device: freed blocks are kept in size classes and reused,
// so the training loop does not call cudaMalloc/cudaFree every step. On an out-of-memory error
// the cache is released and the allocation retried once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace orrery {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu() { return {DeviceType::kCpu, 0}; }
  static Device Cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  std::string ToString() const;  // "cpu" or "cuda:0"
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::kCpu || a.index == b.index);
  }
};

// Parses "cpu", "cuda" or "cuda:N".
StatusOr<Device> ParseDevice(const std::string& text);

// True when this build has CUDA support compiled in (not whether a GPU is present).
bool CudaCompiledIn();
// Number of CUDA devices visible, 0 without a GPU or without CUDA support.
int CudaDeviceCount();

// Raw allocation on a device. Alignment is at least 256 bytes on every device.
StatusOr<void*> DeviceAlloc(Device device, size_t bytes);
void DeviceFree(Device device, void* ptr, size_t bytes);
// Copies `bytes` between any two devices (host<->device, device<->device, host<->host).
Status DeviceCopy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Sets `bytes` of memory to zero.
Status DeviceZero(void* dst, Device device, size_t bytes);

// Statistics of the CUDA caching allocator for one device (all zero on CPU-only builds).
struct CachingAllocatorStats {
  size_t bytes_in_use = 0;  // handed out and not yet freed
  size_t bytes_cached = 0;  // freed, kept for reuse
  size_t peak_bytes_in_use = 0;
  int64_t device_allocs = 0;  // cudaMalloc calls
  int64_t cache_hits = 0;     // allocations served from the cache
};
CachingAllocatorStats GetCachingAllocatorStats(int device_index);
// Returns every cached (free) block of a device to the driver.
void ReleaseCachedDeviceMemory(int device_index);
// Restarts the allocator's peak_bytes_in_use at its bytes_in_use (per-phase peaks).
void ResetCachingAllocatorPeak(int device_index);
// Bytes the caching allocator of a CUDA device can still hand out: the driver's free memory plus
// the allocator's cached blocks (which it releases and retries with when the driver runs out).
// 0 on cpu-only builds, for a CPU device and when the driver cannot say.
int64_t DeviceBytesAvailable(Device device);

}  // namespace orrery
