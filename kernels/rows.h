// Row and column copies between tensors of any dtype, with a CPU twin: the glue of the GPU
// inference engine (model/gpu/gpu_inference.h), which keeps per-slot state in stacked tensors and
// works on the slots of a call gathered into a batch.
//
//   GatherRows   dst[i]         = src[index[i]]            src [R, ...], dst [n, ...]
//   ScatterRows  dst[index[i]]  = src[i]                   src [n, ...], dst [R, ...]
//   CopyColumns  dst[:, dc:dc+w] = src[:, sc:sc+w]         2-D, equal rows
//
// A "row" is everything after the first dimension (the trailing shapes must agree). index is i32
// [n] on the tensors' device; ScatterRows needs distinct entries (a repeated one leaves either
// row). An index outside [0, R) is an OutOfRange error on the CPU; on CUDA it is not checked (the
// callers build indices from validated slot numbers) and the row is skipped. Bytes are copied
// as they are: no dtype conversion, one dtype for src and dst.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// dst is allocated [index.numel(), ...] in src's dtype on its device when undefined.
Status GatherRows(const Tensor& src, const Tensor& index, Tensor* dst);
// dst must be defined.
Status ScatterRows(const Tensor& src, const Tensor& index, Tensor* dst);
// dst must be defined.
Status CopyColumns(const Tensor& src, int64_t src_col, int64_t cols, Tensor* dst, int64_t dst_col);

}  // namespace orrery::kernels
