// The fixed-order cross-block reduction of the GPU ops (its order: column_sums_order.h), for the
// kernels in this directory: an op whose blocks each form a partial of the same outputs writes the
// partials to a [rows, cols] scratch buffer (one row per block) and queues this reduction after
// it, instead of adding them with float atomics. Same inputs, same bits, on every run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace orrery::kernels::cuda {

// out[c] (+)= sum over r < rows of parts[r * cols + c] for c < cols (accumulate: out[c] + sum,
// else sum), T float or double, queued on `stream`. rows == 0 gives a sum of zero.
template <typename T>
Status LaunchColumnSums(const T* parts, int64_t rows, int64_t cols, bool accumulate, T* out,
                        cudaStream_t stream);

}  // namespace orrery::kernels::cuda
