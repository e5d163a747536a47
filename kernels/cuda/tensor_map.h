// TMA tensor maps (the host side of cp.async.bulk.tensor, hopper.cuh) for bf16 matrices read as
// 128-byte-swizzled tiles of 64 columns (wgmma_layout.h). cuTensorMapEncodeTiled is a driver API
// call; it is reached through cudaGetDriverEntryPointByVersion, so nothing links libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/status.h"

namespace orrery::kernels::cuda {

// A map of the row-major bf16 matrix at `base` ([rows][cols], row pitch `pitch` elements >= cols)
// whose box is [box_rows][64] (box_rows <= 256), swizzled by 128 bytes; elements outside the
// matrix read as zero. Fails when the matrix breaks TMA's rules (base 16-byte aligned, pitch a
// multiple of 8 elements, rows and cols in [1, 2^32]) or the driver refuses the map.
StatusOr<CUtensorMap> Bf16TileMap(const void* base, int64_t rows, int64_t cols, int64_t pitch,
                                  int box_rows);

}  // namespace orrery::kernels::cuda
