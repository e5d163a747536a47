// CPU-only build of core/cuda_ipc.h: every call says the build has no CUDA.
#include "core/cuda_ipc.h"

namespace orrery {
namespace {
Status NoCuda() {
  return FailedPreconditionError("this Orrery was built without CUDA (configure with nvcc found)");
}
}  // namespace

StatusOr<void*> CudaIpcAllocate(int, size_t, std::string*) { return NoCuda(); }
void CudaIpcFree(int, void*) {}
StatusOr<void*> CudaIpcOpen(int, const std::string&) { return NoCuda(); }
void CudaIpcClose(int, void*) {}
Status CudaDeviceSynchronize(int) { return NoCuda(); }

}  // namespace orrery
