// Embedding gather / scatter-add: checks, then the CPU loops or CUDA.
#include "kernels/embedding.h"

#include <cstring>
#include <string>

#include "kernels/elementwise_check.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

Status CheckIds(const char* op, const Tensor& ids, Device device) {
  if (!ids.defined() || ids.dtype() != DType::kI32 || ids.ndim() != 1 ||
      !(ids.device() == device)) {
    return InvalidArgumentError(std::string(op) + ": ids " +
                                (ids.defined() ? ids.ToString() : "undefined") +
                                ", expected i32 [N] on " + device.ToString());
  }
  return Status::OK();
}

Status BadId(const char* op, int64_t pos, int64_t id, int64_t vocab) {
  return OutOfRangeError(std::string(op) + ": ids[" + std::to_string(pos) + "] = " +
                         std::to_string(id) + ", expected [0, " + std::to_string(vocab) + ")");
}

Status CheckFloat(const char* op, const char* name, const Tensor& t) {
  const bool cpu = t.device().is_cpu();
  const DType dt = t.dtype();
  if (t.ndim() != 2 || (cpu ? (dt != DType::kF32 && dt != DType::kF64)
                            : (dt != DType::kF32 && dt != DType::kBF16))) {
    return InvalidArgumentError(
        std::string(op) + ": " + name + " " + t.ToString() +
        (cpu ? ", expected 2-D f32 or f64 on cpu" : ", expected 2-D bf16 or f32 on cuda"));
  }
  return Status::OK();
}

template <typename T>
Status GatherCpu(const Tensor& table, const Tensor& ids, Tensor* y) {
  const int64_t v = table.dim(0), d = table.dim(1);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t n = 0; n < ids.numel(); ++n) {
    if (id[n] < 0 || id[n] >= v) return BadId("embedding", n, id[n], v);
    std::memcpy(y->data<T>() + n * d, table.data<T>() + id[n] * d, d * sizeof(T));
  }
  return Status::OK();
}

template <typename T>
Status ScatterCpu(const Tensor& ids, const Tensor& dy, Tensor* dtable) {
  const int64_t v = dtable->dim(0), d = dtable->dim(1);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t n = 0; n < ids.numel(); ++n) {
    if (id[n] < 0 || id[n] >= v) return BadId("embedding_backward", n, id[n], v);
  }
  for (int64_t n = 0; n < ids.numel(); ++n) {
    T* row = dtable->data<T>() + id[n] * d;
    const T* g = dy.data<T>() + n * d;
    for (int64_t i = 0; i < d; ++i) row[i] += g[i];
  }
  return Status::OK();
}

}  // namespace

Status EmbeddingGather(const Tensor& table, const Tensor& ids, Tensor* y) {
  return EmbeddingGather(table, ids, EmbeddingGatherOptions{}, y);
}

Status EmbeddingGather(const Tensor& table, const Tensor& ids,
                       const EmbeddingGatherOptions& options, Tensor* y) {
  PhaseScope phase("op.embedding");
  constexpr const char* kOp = "embedding";
  if (!table.defined() || y == nullptr) return InvalidArgumentError("embedding: table, y required");
  ORRERY_RETURN_IF_ERROR(CheckFloat(kOp, "table", table));
  ORRERY_RETURN_IF_ERROR(CheckIds(kOp, ids, table.device()));
  ORRERY_RETURN_IF_ERROR(
      AllocateAs(kOp, "y", {ids.numel(), table.dim(1)}, table.dtype(), table.device(), y));
  if (ids.numel() == 0) return Status::OK();
  if (table.device().is_cpu()) {
    return table.dtype() == DType::kF32 ? GatherCpu<float>(table, ids, y)
                                        : GatherCpu<double>(table, ids, y);
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::EmbeddingGatherCuda(table, ids, options.check_ids, y);
#else
  (void)options;
  return NoCuda(kOp, table);
#endif
}

Status EmbeddingScatterAdd(const Tensor& ids, const Tensor& dy, Tensor* dtable) {
  PhaseScope phase("op.embedding_grad");
  constexpr const char* kOp = "embedding_backward";
  if (!dy.defined() || dtable == nullptr || !dtable->defined()) {
    return InvalidArgumentError("embedding_backward: dy and a defined dtable are required");
  }
  ORRERY_RETURN_IF_ERROR(CheckFloat(kOp, "dy", dy));
  ORRERY_RETURN_IF_ERROR(CheckIds(kOp, ids, dy.device()));
  const DType grad_type = dy.device().is_cpu() ? dy.dtype() : DType::kF32;
  if (dtable->ndim() != 2) {
    return InvalidArgumentError("embedding_backward: dtable " + dtable->ToString() +
                                ", expected 2-D");
  }
  ORRERY_RETURN_IF_ERROR(
      AllocateAs(kOp, "dtable", {dtable->dim(0), dy.dim(1)}, grad_type, dy.device(), dtable));
  if (dy.dim(0) != ids.numel()) {
    return InvalidArgumentError("embedding_backward: dy " + dy.ToString() + " has " +
                                std::to_string(dy.dim(0)) + " rows for " +
                                std::to_string(ids.numel()) + " ids");
  }
  if (ids.numel() == 0) return Status::OK();
  if (dy.device().is_cpu()) {
    return dy.dtype() == DType::kF32 ? ScatterCpu<float>(ids, dy, dtable)
                                     : ScatterCpu<double>(ids, dy, dtable);
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::EmbeddingScatterAddCuda(ids, dy, dtable);
#else
  return NoCuda(kOp, dy);
#endif
}

}  // namespace orrery::kernels
