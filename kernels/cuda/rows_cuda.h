// The CUDA halves of kernels/rows.h (checked by the dispatcher in kernels/rows_op.cc): byte
// copies of rows by index, and a column block through cudaMemcpy2DAsync.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels::cuda {

// row_bytes: bytes per row; `scatter` false: dst[i] = src[index[i]], true: dst[index[i]] = src[i].
// rows_src / rows_dst: the first dimensions (out-of-range indices are skipped).
Status CopyRowsCuda(const Tensor& src, const Tensor& index, int64_t row_bytes, int64_t rows_src,
                    int64_t rows_dst, bool scatter, Tensor* dst);
Status CopyColumnsCuda(const Tensor& src, int64_t src_col, int64_t cols, Tensor* dst,
                       int64_t dst_col);

}  // namespace orrery::kernels::cuda
