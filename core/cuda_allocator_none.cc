// CPU-only build: CUDA requests fail with a clear message.
#include "core/cuda_allocator.h"

namespace orrery {
namespace {
Status NoCuda() {
  return FailedPreconditionError("this Orrery was built without CUDA (configure with nvcc found)");
}
}  // namespace

bool CudaCompiledIn() { return false; }
int CudaDeviceCount() { return 0; }
StatusOr<void*> CudaCachingAlloc(int, size_t) { return NoCuda(); }
void CudaCachingFree(int, void*, size_t) {}
Status CudaCopy(void*, bool, const void*, bool, size_t) { return NoCuda(); }
Status CudaZero(int, void*, size_t) { return NoCuda(); }
CachingAllocatorStats GetCachingAllocatorStats(int) { return {}; }
void ReleaseCachedDeviceMemory(int) {}
void ResetCachingAllocatorPeak(int) {}
int64_t DeviceBytesAvailable(Device) { return 0; }

}  // namespace orrery
