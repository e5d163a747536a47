// Matmul: checks, then the CPU twin (OpenBLAS) or cuBLASLt.
#include "kernels/matmul.h"

#include <string>

#include "kernels/gemm.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

Status Bad(const std::string& what) { return InvalidArgumentError("matmul: " + what); }

}  // namespace

Status Matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o, Tensor* c) {
  PhaseScope phase("op.matmul");
  if (!a.defined() || !b.defined() || c == nullptr) return Bad("a, b and c are required");
  if (a.ndim() != 2 || b.ndim() != 2) {
    return Bad("a " + a.ToString() + " and b " + b.ToString() + " must be 2-D");
  }
  const int64_t m = o.trans_a ? a.dim(1) : a.dim(0), k = o.trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = o.trans_b ? b.dim(1) : b.dim(0), n = o.trans_b ? b.dim(0) : b.dim(1);
  if (k != kb) {
    return Bad("inner dimensions differ: op(a) " + a.ToString() + " has " + std::to_string(k) +
               ", op(b) " + b.ToString() + " has " + std::to_string(kb));
  }
  if (!(a.device() == b.device())) return Bad("a and b are on different devices");
  if (a.dtype() != b.dtype()) return Bad("a and b have different dtypes");
  if (!c->defined()) {
    if (o.beta != 0.0f) return Bad("c is undefined but beta is not 0");
    ORRERY_ASSIGN_OR_RETURN(*c, Tensor::Allocate({m, n}, a.dtype(), a.device()));
  }
  if (c->shape() != Shape{m, n}) {
    return Bad("c " + c->ToString() + ", expected shape " + ShapeToString({m, n}));
  }
  if (!(c->device() == a.device())) return Bad("c is on another device than a");
  if (m == 0 || n == 0) return Status::OK();
  if (a.device().is_cpu()) {
    if (c->dtype() != a.dtype()) return Bad("on cpu a, b and c must share one dtype");
    if (a.dtype() == DType::kF32) {
      if (k == 0) {
        if (o.beta == 0.0f) return c->SetZero();
        float* p = c->data<float>();
        for (int64_t i = 0; i < c->numel(); ++i) p[i] *= o.beta;
        return Status::OK();
      }
      Gemm<float>(o.trans_a, o.trans_b, m, n, k, o.alpha, a.data<float>(), b.data<float>(), o.beta,
                  c->data<float>());
      return Status::OK();
    }
    if (a.dtype() == DType::kF64) {
      if (k == 0) {
        double* p = c->data<double>();
        for (int64_t i = 0; i < c->numel(); ++i) p[i] = o.beta == 0.0f ? 0.0 : p[i] * o.beta;
        return Status::OK();
      }
      Gemm<double>(o.trans_a, o.trans_b, m, n, k, o.alpha, a.data<double>(), b.data<double>(),
                   o.beta, c->data<double>());
      return Status::OK();
    }
    return Bad("a " + a.ToString() + ": expected f32 or f64 on cpu");
  }
#if defined(ORRERY_KERNELS_CUDA)
  const bool bf16 =
      a.dtype() == DType::kBF16 && (c->dtype() == DType::kBF16 || c->dtype() == DType::kF32);
  const bool f32 = a.dtype() == DType::kF32 && c->dtype() == DType::kF32;
  if (!bf16 && !f32) {
    return Bad("a " + a.ToString() + ", c " + c->ToString() +
               ": expected bf16 a, b with bf16 or f32 c, or all f32, on cuda");
  }
  return cuda::MatmulCuda(a, b, o, m, n, k, c);
#else
  return FailedPreconditionError("matmul: " + a.ToString() + ": this build has no CUDA kernels");
#endif
}

namespace {

// The batch's matrices lie inside its tensor (element indices, all non-negative).
Status CheckBatch(const char* name, const MatrixBatch& x, int64_t batch) {
  if (!x.t.defined()) return Bad(std::string(name) + " is undefined");
  if (x.rows < 0 || x.cols < 0 || x.offset < 0 || x.batch_stride < 0 || x.ld < x.cols || x.ld < 1) {
    return Bad(std::string(name) + ": rows " + std::to_string(x.rows) + ", cols " +
               std::to_string(x.cols) + ", ld " + std::to_string(x.ld) + ", offset " +
               std::to_string(x.offset) + ", batch stride " + std::to_string(x.batch_stride) +
               ": expected non-negative values and ld >= max(cols, 1)");
  }
  if (x.rows == 0 || x.cols == 0 || batch == 0) return Status::OK();
  const int64_t last = x.offset + (batch - 1) * x.batch_stride + (x.rows - 1) * x.ld + x.cols;
  if (last > x.t.numel()) {
    return Bad(std::string(name) + ": matrices of " + std::to_string(x.rows) + " x " +
               std::to_string(x.cols) + " (ld " + std::to_string(x.ld) + ", offset " +
               std::to_string(x.offset) + ", batch stride " + std::to_string(x.batch_stride) +
               ") x " + std::to_string(batch) + " reach element " + std::to_string(last) + " of " +
               x.t.ToString());
  }
  return Status::OK();
}

template <typename T>
void BatchedCpu(const MatrixBatch& a, const MatrixBatch& b, int64_t batch, const MatmulOptions& o,
                int64_t m, int64_t n, int64_t k, const MatrixBatch& c) {
  for (int64_t i = 0; i < batch; ++i) {
    const T* ap = a.t.data<T>() + a.offset + i * a.batch_stride;
    const T* bp = b.t.data<T>() + b.offset + i * b.batch_stride;
    T* cp = c.t.data<T>() + c.offset + i * c.batch_stride;
    if (k == 0) {
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < n; ++j) {
          T& v = cp[r * c.ld + j];
          v = o.beta == 0.0f ? T(0) : v * static_cast<T>(o.beta);
        }
      }
      continue;
    }
    Gemm(o.trans_a, o.trans_b, m, n, k, static_cast<T>(o.alpha), ap, a.ld, bp, b.ld,
         static_cast<T>(o.beta), cp, c.ld);
  }
}

}  // namespace

Status MatmulStridedBatched(const MatrixBatch& a, const MatrixBatch& b, int64_t batch,
                            const MatmulOptions& o, const MatrixBatch& c) {
  PhaseScope phase("op.matmul_batched");
  if (batch < 0) return Bad("batch " + std::to_string(batch) + ", expected >= 0");
  ORRERY_RETURN_IF_ERROR(CheckBatch("a", a, batch));
  ORRERY_RETURN_IF_ERROR(CheckBatch("b", b, batch));
  ORRERY_RETURN_IF_ERROR(CheckBatch("c", c, batch));
  const int64_t m = o.trans_a ? a.cols : a.rows, k = o.trans_a ? a.rows : a.cols;
  const int64_t kb = o.trans_b ? b.cols : b.rows, n = o.trans_b ? b.rows : b.cols;
  if (k != kb) {
    return Bad("inner dimensions differ: op(a) has " + std::to_string(k) + ", op(b) has " +
               std::to_string(kb));
  }
  if (c.rows != m || c.cols != n) {
    return Bad("c is " + std::to_string(c.rows) + " x " + std::to_string(c.cols) + ", expected " +
               std::to_string(m) + " x " + std::to_string(n));
  }
  if (!(a.t.device() == b.t.device()) || !(a.t.device() == c.t.device())) {
    return Bad("a, b and c are on different devices");
  }
  if (a.t.dtype() != b.t.dtype()) return Bad("a and b have different dtypes");
  if (m == 0 || n == 0 || batch == 0) return Status::OK();
  if (a.t.device().is_cpu()) {
    if (c.t.dtype() != a.t.dtype()) return Bad("on cpu a, b and c must share one dtype");
    if (a.t.dtype() == DType::kF32) {
      BatchedCpu<float>(a, b, batch, o, m, n, k, c);
      return Status::OK();
    }
    if (a.t.dtype() == DType::kF64) {
      BatchedCpu<double>(a, b, batch, o, m, n, k, c);
      return Status::OK();
    }
    return Bad("a " + a.t.ToString() + ": expected f32 or f64 on cpu");
  }
#if defined(ORRERY_KERNELS_CUDA)
  const bool bf16 =
      a.t.dtype() == DType::kBF16 && (c.t.dtype() == DType::kBF16 || c.t.dtype() == DType::kF32);
  const bool f32 = a.t.dtype() == DType::kF32 && c.t.dtype() == DType::kF32;
  if (!bf16 && !f32) {
    return Bad("a " + a.t.ToString() + ", c " + c.t.ToString() +
               ": expected bf16 a, b with bf16 or f32 c, or all f32, on cuda");
  }
  if (k == 0) return Bad("k = 0 is not supported on cuda");
  return cuda::MatmulStridedBatchedCuda(a, b, batch, o, m, n, k, c);
#else
  return FailedPreconditionError("matmul: " + a.t.ToString() + ": this build has no CUDA kernels");
#endif
}

}  // namespace orrery::kernels
