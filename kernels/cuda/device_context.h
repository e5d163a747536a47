// The per-device context of the GPU ops: the stream they are queued on, a cuBLASLt handle and its
// workspace. One context per device, created on first use and kept for the life of the process,
// so no op pays for handle creation or a workspace allocation per call.
//
// Stream: the device's one stream of core/cuda_allocator.h (CudaStream), where Tensor::CopyFrom,
// SetZero and the caching allocator's users queue their work too. Every kernel launch, cuBLASLt
// call and async copy of an op goes there and nowhere else (no launch on the legacy stream), so
// one device's work runs in the order the host queued it and can be captured into a CUDA graph
// (core/cuda_graph.h; the header of cuda_allocator.h says why one dedicated stream per device).
// Inside a SideStream body (core/cuda_side_stream.h) Get returns the device's second context,
// whose stream is the side stream and whose workspace is its own.
//
// Thread safety: Get() may be called from any thread; an op's use of the handle and workspace is
// not synchronised, so one host thread drives a device at a time (one rank, one thread).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "core/status.h"

namespace orrery::kernels::cuda {

class DeviceContext {
 public:
  // The context of device `index`; fails when the device does not exist or the handle or
  // workspace cannot be created.
  static StatusOr<DeviceContext*> Get(int index);

  int index() const { return index_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

  // cuBLASLt's guidance for Hopper: 32 MiB lets every algorithm it may pick run.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

 private:
  DeviceContext() = default;
  int index_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// An error Status for a failed CUDA runtime call, naming `what` (OK for cudaSuccess).
Status CudaStatus(cudaError_t err, const char* what);
// The same for cuBLAS(Lt) calls.
Status CublasStatus(cublasStatus_t st, const char* what);
// The launch error of the last kernel queued on this thread (OK when there is none).
Status LastLaunchStatus(const char* kernel);

}  // namespace orrery::kernels::cuda
