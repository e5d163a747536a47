// Row gathers and scatters by index and column-block copies (kernels/rows.h): checks, then the
// CPU memcpy loops or CUDA.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/rows.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/rows_cuda.h"
#endif

namespace orrery::kernels {
namespace {

Status CheckIndex(const char* op, const Tensor& index, Device device) {
  if (!index.defined() || index.dtype() != DType::kI32 || index.ndim() != 1 ||
      !(index.device() == device)) {
    return InvalidArgumentError(std::string(op) + ": index " +
                                (index.defined() ? index.ToString() : "undefined") +
                                ", expected i32 [n] on " + device.ToString());
  }
  return Status::OK();
}

Status CheckRows(const char* op, const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.ndim() < 1 || b.ndim() != a.ndim() ||
      a.dtype() != b.dtype() || !(a.device() == b.device())) {
    return InvalidArgumentError(std::string(op) + ": " +
                                (a.defined() ? a.ToString() : "undefined") + " and " +
                                (b.defined() ? b.ToString() : "undefined") +
                                ": expected tensors of one dtype on one device");
  }
  for (int i = 1; i < a.ndim(); ++i) {
    if (a.dim(i) != b.dim(i)) {
      return InvalidArgumentError(std::string(op) + ": " + a.ToString() + " and " + b.ToString() +
                                  ": the rows (all dimensions after the first) differ");
    }
  }
  return Status::OK();
}

// The shared body of GatherRows / ScatterRows once dst is defined.
Status CopyRows(const char* op, const Tensor& src, const Tensor& index, bool scatter, Tensor* dst) {
  ORRERY_RETURN_IF_ERROR(CheckRows(op, src, *dst));
  ORRERY_RETURN_IF_ERROR(CheckIndex(op, index, src.device()));
  const Tensor& indexed = scatter ? *dst : src;
  const Tensor& dense = scatter ? src : *dst;
  if (dense.dim(0) != index.numel()) {
    return InvalidArgumentError(std::string(op) + ": " + dense.ToString() + " has " +
                                std::to_string(dense.dim(0)) + " rows for " +
                                std::to_string(index.numel()) + " indices");
  }
  const int64_t rows = indexed.dim(0);
  const int64_t row_bytes =
      src.dim(0) > 0 ? static_cast<int64_t>(src.nbytes()) / src.dim(0)
                     : static_cast<int64_t>(dst->nbytes()) / std::max<int64_t>(dst->dim(0), 1);
  if (index.numel() == 0 || row_bytes == 0) return Status::OK();
  if (src.device().is_cpu()) {
    const int32_t* id = index.data<int32_t>();
    for (int64_t i = 0; i < index.numel(); ++i) {
      if (id[i] < 0 || id[i] >= rows) {
        return OutOfRangeError(std::string(op) + ": index[" + std::to_string(i) +
                               "] = " + std::to_string(id[i]) + ", expected [0, " +
                               std::to_string(rows) + ")");
      }
    }
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(dst->raw_data());
    for (int64_t i = 0; i < index.numel(); ++i) {
      const int64_t from = scatter ? i : id[i], to = scatter ? id[i] : i;
      std::memcpy(d + to * row_bytes, s + from * row_bytes, static_cast<size_t>(row_bytes));
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::CopyRowsCuda(src, index, row_bytes, src.dim(0), dst->dim(0), scatter, dst);
#else
  return FailedPreconditionError(std::string(op) + ": tensors on " + src.device().ToString() +
                                 " but this build has no CUDA kernels");
#endif
}

}  // namespace

Status GatherRows(const Tensor& src, const Tensor& index, Tensor* dst) {
  if (dst == nullptr || !src.defined() || src.ndim() < 1) {
    return InvalidArgumentError("gather_rows: src (at least 1-D) and dst are required");
  }
  if (!dst->defined()) {
    Shape shape = src.shape();
    shape[0] = index.defined() ? index.numel() : 0;
    ORRERY_ASSIGN_OR_RETURN(*dst, Tensor::Allocate(shape, src.dtype(), src.device()));
  }
  return CopyRows("gather_rows", src, index, false, dst);
}

Status ScatterRows(const Tensor& src, const Tensor& index, Tensor* dst) {
  if (dst == nullptr || !dst->defined()) {
    return InvalidArgumentError("scatter_rows: a defined dst is required");
  }
  return CopyRows("scatter_rows", src, index, true, dst);
}

Status CopyColumns(const Tensor& src, int64_t src_col, int64_t cols, Tensor* dst, int64_t dst_col) {
  constexpr const char* kOp = "copy_columns";
  if (dst == nullptr || !dst->defined() || !src.defined() || src.ndim() != 2 || dst->ndim() != 2 ||
      src.dtype() != dst->dtype() || !(src.device() == dst->device()) ||
      src.dim(0) != dst->dim(0)) {
    return InvalidArgumentError(std::string(kOp) + ": src " +
                                (src.defined() ? src.ToString() : "undefined") + ", dst " +
                                (dst && dst->defined() ? dst->ToString() : "undefined") +
                                ": expected 2-D tensors of one dtype and row count on one device");
  }
  if (cols < 0 || src_col < 0 || dst_col < 0 || src_col + cols > src.dim(1) ||
      dst_col + cols > dst->dim(1)) {
    return InvalidArgumentError(std::string(kOp) + ": columns [" + std::to_string(src_col) + ", " +
                                std::to_string(src_col + cols) + ") of " + src.ToString() +
                                " to [" + std::to_string(dst_col) + ", " +
                                std::to_string(dst_col + cols) + ") of " + dst->ToString() +
                                " are out of range");
  }
  if (cols == 0 || src.dim(0) == 0) return Status::OK();
  if (src.device().is_cpu()) {
    const size_t es = DTypeSize(src.dtype());
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(dst->raw_data());
    for (int64_t r = 0; r < src.dim(0); ++r) {
      std::memcpy(d + (r * dst->dim(1) + dst_col) * es, s + (r * src.dim(1) + src_col) * es,
                  static_cast<size_t>(cols) * es);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::CopyColumnsCuda(src, src_col, cols, dst, dst_col);
#else
  return FailedPreconditionError(std::string(kOp) + ": tensors on " + src.device().ToString() +
                                 " but this build has no CUDA kernels");
#endif
}

}  // namespace orrery::kernels
