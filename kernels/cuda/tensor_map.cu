// Bf16TileMap: cuTensorMapEncodeTiled through the runtime's driver entry point.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma_layout.h"

namespace orrery::kernels::cuda {
namespace {

// The driver's cuTensorMapEncodeTiled (the CUDA 12.0 ABI), looked up once.
StatusOr<PFN_cuTensorMapEncodeTiled_v12000> EncodeTiled() {
  static const auto lookup = []() -> std::pair<void*, std::string> {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &found);
    if (err != cudaSuccess) return {nullptr, cudaGetErrorString(err)};
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      return {nullptr, "the driver has no cuTensorMapEncodeTiled"};
    }
    return {fn, ""};
  }();
  if (lookup.first == nullptr) {
    return FailedPreconditionError("cuda: cuTensorMapEncodeTiled: " + lookup.second);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(lookup.first);
}

}  // namespace

StatusOr<CUtensorMap> Bf16TileMap(const void* base, int64_t rows, int64_t cols, int64_t pitch,
                                  int box_rows) {
  constexpr int64_t kMaxDim = int64_t{1} << 32;
  const auto address = reinterpret_cast<uintptr_t>(base);
  if (address % 16 != 0 || pitch % 8 != 0 || pitch < cols || rows < 1 || rows > kMaxDim ||
      cols < 1 || cols > kMaxDim || box_rows < 1 || box_rows > 256) {
    return InvalidArgumentError(
        "cuda: Bf16TileMap: base " + std::to_string(address) + ", [" + std::to_string(rows) + "][" +
        std::to_string(cols) + "] pitch " + std::to_string(pitch) + ", box rows " +
        std::to_string(box_rows) +
        ", expected a 16-byte aligned base, a pitch of 8k >= cols elements, dims in [1, 2^32], "
        "box rows in [1, 256]");
  }
  ORRERY_ASSIGN_OR_RETURN(PFN_cuTensorMapEncodeTiled_v12000 encode, EncodeTiled());
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(pitch) * 2};  // bytes, of dim 1
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(wgmma::kBlockCols),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult res =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    return InternalError("cuda: cuTensorMapEncodeTiled([" + std::to_string(rows) + "][" +
                         std::to_string(cols) + "], box [" + std::to_string(box_rows) +
                         "][64]): CUresult " + std::to_string(static_cast<int>(res)));
  }
  return map;
}

}  // namespace orrery::kernels::cuda
