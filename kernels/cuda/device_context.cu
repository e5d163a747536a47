#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "core/cuda_allocator.h"
#include "core/cuda_side_stream.h"
#include "kernels/cuda/device_context.h"

namespace orrery::kernels::cuda {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return InternalError(std::string("cuda: ") + what + ": " + cudaGetErrorName(err) + ": " +
                       cudaGetErrorString(err));
}

Status CublasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return InternalError(std::string("cublasLt: ") + what + ": " + cublasGetStatusName(st) + ": " +
                       cublasGetStatusString(st));
}

Status LastLaunchStatus(const char* kernel) { return CudaStatus(cudaGetLastError(), kernel); }

StatusOr<DeviceContext*> DeviceContext::Get(int index) {
  constexpr int kMaxDevices = 64;
  // Per device, the context of its stream and that of its side stream (core/cuda_side_stream.h),
  // which this thread queues on inside a SideStream body.
  static std::array<std::array<std::unique_ptr<DeviceContext>, kMaxDevices>, 2> lanes;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& contexts = lanes[InSideStream(index) ? 1 : 0];
  // Every op asks for its context: once made, it is returned without asking the driver again.
  if (index >= 0 && index < kMaxDevices && contexts[index]) return contexts[index].get();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (index < 0 || index >= count || index >= kMaxDevices) {
    return FailedPreconditionError("cuda: no device " + std::to_string(index) + " (" +
                                   std::to_string(count) + " visible)");
  }
  auto ctx = std::unique_ptr<DeviceContext>(new DeviceContext());
  ctx->index_ = index;
  ORRERY_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(index), "cudaSetDevice"));
  ORRERY_ASSIGN_OR_RETURN(ctx->stream_, CudaStream(index));
  ORRERY_RETURN_IF_ERROR(CublasStatus(cublasLtCreate(&ctx->lt_), "cublasLtCreate"));
  Status st = CudaStatus(cudaMalloc(&ctx->workspace_, kWorkspaceBytes), "cudaMalloc(workspace)");
  if (!st.ok()) {
    cublasLtDestroy(ctx->lt_);
    return st;
  }
  ctx->workspace_bytes_ = kWorkspaceBytes;
  contexts[index] = std::move(ctx);
  return contexts[index].get();
}

}  // namespace orrery::kernels::cuda
