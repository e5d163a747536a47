// CUDA build of core/cuda_ipc.h.
#include "core/cuda_ipc.h"

#include <cuda_runtime.h>

#include <cstring>

namespace orrery {
namespace {

Status Check(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::OK();
  cudaGetLastError();  // clear the error so later calls of this thread start clean
  return InternalError(what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace

StatusOr<void*> CudaIpcAllocate(int device, size_t bytes, std::string* handle) {
  ORRERY_RETURN_IF_ERROR(
      Check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhaustedError("out of memory on cuda:" + std::to_string(device) +
                                  " allocating a shared buffer of " + std::to_string(bytes) +
                                  " bytes");
  }
  cudaIpcMemHandle_t h;
  if (Status s = Check(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle"); !s.ok()) {
    cudaFree(p);
    return s;
  }
  static_assert(sizeof(h) == kCudaIpcHandleBytes, "cudaIpcMemHandle_t changed size");
  handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return p;
}

void CudaIpcFree(int device, void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(device);
  cudaFree(ptr);
}

StatusOr<void*> CudaIpcOpen(int device, const std::string& handle) {
  if (handle.size() != kCudaIpcHandleBytes) {
    return InvalidArgumentError("CUDA IPC handle of " + std::to_string(handle.size()) +
                                " bytes (expected " + std::to_string(kCudaIpcHandleBytes) + ")");
  }
  ORRERY_RETURN_IF_ERROR(
      Check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  ORRERY_RETURN_IF_ERROR(Check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                               "cudaIpcOpenMemHandle on cuda:" + std::to_string(device)));
  return p;
}

void CudaIpcClose(int device, void* ptr) {
  if (ptr == nullptr) return;
  cudaSetDevice(device);
  cudaIpcCloseMemHandle(ptr);
}

Status CudaDeviceSynchronize(int device) {
  ORRERY_RETURN_IF_ERROR(
      Check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace orrery
