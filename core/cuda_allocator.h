// The CUDA side of core/device.h. In builds without CUDA every function returns
// FailedPrecondition ("built without CUDA"), so CPU-only binaries still link and report clearly.
#pragma once

#include <cstddef>

#include "core/device.h"
#include "core/status.h"

namespace orrery {

StatusOr<void*> CudaCachingAlloc(int device_index, size_t bytes);
void CudaCachingFree(int device_index, void* ptr, size_t bytes);
Status CudaCopy(void* dst, bool dst_on_device, const void* src, bool src_on_device, size_t bytes);
Status CudaZero(int device_index, void* dst, size_t bytes);

}  // namespace orrery
