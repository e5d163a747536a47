// The CUDA side of core/shared_buffer.h: device memory another process on the same host can map
// (CUDA IPC). In builds without CUDA every call fails with FailedPrecondition ("built without
// CUDA"), so CPU-only binaries link and say why.
//
// Memory exported here comes from cudaMalloc itself, never from the caching allocator:
// cudaIpcGetMemHandle names a whole allocation, and a cached block may be a piece of one.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace orrery {

// The size of a cudaIpcMemHandle_t (the driver's opaque handle).
inline constexpr size_t kCudaIpcHandleBytes = 64;

// cudaMalloc of `bytes` on `device` and its IPC handle (kCudaIpcHandleBytes opaque bytes).
StatusOr<void*> CudaIpcAllocate(int device, size_t bytes, std::string* handle);
void CudaIpcFree(int device, void* ptr);
// Maps another process's allocation on `device` (peer access enabled when the exporter's device
// differs). Fails in the exporting process itself (CUDA does not open a process's own handles).
StatusOr<void*> CudaIpcOpen(int device, const std::string& handle);
void CudaIpcClose(int device, void* ptr);
// Waits for all work queued on `device` (the copies into or out of a shared buffer).
Status CudaDeviceSynchronize(int device);

}  // namespace orrery
