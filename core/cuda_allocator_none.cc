// CPU-only build: CUDA requests fail with a clear message.
#include "core/cuda_allocator.h"
#include "core/cuda_side_stream.h"

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
Status CudaCopy(void*, int, const void*, int, size_t) { return NoCuda(); }
Status CudaZero(int, void*, size_t) { return NoCuda(); }
StatusOr<CUstream_st*> CudaStream(int) { return NoCuda(); }
Status CudaSynchronize(int) { return NoCuda(); }
StatusOr<uint64_t> CudaCreatePrivatePool(int) { return NoCuda(); }
Status CudaBeginPrivatePool(int, uint64_t) { return NoCuda(); }
void CudaEndPrivatePool(int) {}
void CudaReleasePrivatePool(int, uint64_t) {}
CachingAllocatorStats GetCachingAllocatorStats(int) { return {}; }
void ReleaseCachedDeviceMemory(int) {}
void ResetCachingAllocatorPeak(int) {}
int64_t DeviceBytesAvailable(Device) { return 0; }

// No CUDA device exists: every SideStream body runs inline.
SideStream::~SideStream() = default;
Status SideStream::Run(Device, const std::function<Status()>& body) {
  overlapped_ = false;
  return body();
}
Status SideStream::Join() {
  device_index_ = -1;  // never set: there is nothing to join
  return Status::OK();
}
bool InSideStream(int) { return false; }

}  // namespace orrery
