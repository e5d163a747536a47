// LmHeadCrossEntropy: checks, then per chunk of rows the logits product, the row-wise softmax
// cross-entropy (CPU loop or CUDA kernel) and the two backward products.
#include "kernels/lm_head_loss.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/elementwise_check.h"
#include "kernels/matmul.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "lm_head_loss";

Status Bad(const std::string& what) { return InvalidArgumentError(std::string(kOp) + ": " + what); }

// One chunk's rows on the CPU: the loss into *loss, and (backward) dz in place of the logits.
template <typename T>
Status RowsCrossEntropyCpu(Tensor* logits, const Tensor& targets, const Tensor& mask, int64_t row0,
                           double scale, bool backward, double* loss) {
  const int64_t rows = logits->dim(0), v = logits->dim(1);
  const int32_t* t = targets.data<int32_t>();
  const float* m = mask.defined() ? mask.data<float>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    T* z = logits->data<T>() + r * v;
    const double weight = m != nullptr ? m[r] : 1.0;
    if (weight == 0.0) {
      if (backward) std::fill(z, z + v, T(0));
      continue;
    }
    if (t[r] < 0 || t[r] >= v) {
      return OutOfRangeError(std::string(kOp) + ": targets[" + std::to_string(row0 + r) + "] = " +
                             std::to_string(t[r]) + ", expected [0, " + std::to_string(v) + ")");
    }
    double mx = -INFINITY;
    for (int64_t i = 0; i < v; ++i) mx = std::max(mx, static_cast<double>(z[i]));
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp(static_cast<double>(z[i]) - mx);
    const double lse = mx + std::log(sum);
    *loss += weight * (lse - static_cast<double>(z[t[r]]));
    if (!backward) continue;
    for (int64_t i = 0; i < v; ++i) {
      const double p = std::exp(static_cast<double>(z[i]) - lse);
      z[i] = static_cast<T>(scale * weight * (p - (i == t[r] ? 1.0 : 0.0)));
    }
  }
  return Status::OK();
}

}  // namespace

Status LmHeadCrossEntropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                          const Tensor& mask, const LmHeadLossOptions& o, double* loss_sum,
                          Tensor* dx, Tensor* dw) {
  PhaseScope phase("op.lm_head_loss");
  if (loss_sum == nullptr) return Bad("loss_sum is required");
  ORRERY_RETURN_IF_ERROR(ExpectLmHeadOperands(kOp, x, w));
  const Device dev = x.device();
  const bool cpu = dev.is_cpu();
  const DType dt = x.dtype();
  const int64_t n = x.dim(0), v = w.dim(0);
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "targets", targets, {n}, DType::kI32, dev));
  if (mask.defined()) {
    ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "mask", mask, {n}, DType::kF32, dev));
  }
  if (o.chunk_rows <= 0) return Bad("chunk_rows must be > 0");
  const bool backward = dx != nullptr;
  if (backward) ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dx", x, dx));
  if (dw != nullptr) {
    if (!backward) return Bad("dw needs dx (the backward)");
    if (!dw->defined()) return Bad("dw must be allocated (it is accumulated into)");
    ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dw", w.shape(), cpu ? dt : DType::kF32, dev, dw));
  }
  *loss_sum = 0;
  if (n == 0) return Status::OK();
#if !defined(ORRERY_KERNELS_CUDA)
  if (!cpu) return NoCuda(kOp, x);
#endif
  const int64_t chunk = std::min(o.chunk_rows, n);
  // The logits of one chunk: x's dtype on the cpu, f32 on cuda; dz in their place, except for
  // bf16, where dz is rounded into its own bf16 buffer for the products.
  ORRERY_ASSIGN_OR_RETURN(Tensor logits, Tensor::Allocate({chunk, v}, cpu ? dt : DType::kF32, dev));
  Tensor dz_buf;
  if (backward && !cpu && dt == DType::kBF16) {
    ORRERY_ASSIGN_OR_RETURN(dz_buf, Tensor::Allocate({chunk, v}, DType::kBF16, dev));
  }
  Tensor acc, flag;  // cuda: the loss (f64 [1]) and the first bad target (i32 [1]) on the device
#if defined(ORRERY_KERNELS_CUDA)
  if (!cpu) ORRERY_RETURN_IF_ERROR(cuda::LossAccumulatorsCuda(dev, &acc, &flag));
#endif
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t rows = std::min(chunk, n - start);
    ORRERY_ASSIGN_OR_RETURN(Tensor xc, x.Slice(start, start + rows));
    ORRERY_ASSIGN_OR_RETURN(Tensor lc, logits.Slice(0, rows));
    ORRERY_RETURN_IF_ERROR(Matmul(xc, w, {false, true, 1.0f, 0.0f}, &lc));
    ORRERY_ASSIGN_OR_RETURN(Tensor tc, targets.Slice(start, start + rows));
    Tensor mc;
    if (mask.defined()) {
      ORRERY_ASSIGN_OR_RETURN(mc, mask.Slice(start, start + rows));
    }
    Tensor dzc = lc;
    if (dz_buf.defined()) {
      ORRERY_ASSIGN_OR_RETURN(dzc, dz_buf.Slice(0, rows));
    }
    if (cpu) {
      ORRERY_RETURN_IF_ERROR(
          dt == DType::kF32
              ? RowsCrossEntropyCpu<float>(&lc, tc, mc, start, o.grad_scale, backward, loss_sum)
              : RowsCrossEntropyCpu<double>(&lc, tc, mc, start, o.grad_scale, backward, loss_sum));
    } else {
#if defined(ORRERY_KERNELS_CUDA)
      ORRERY_RETURN_IF_ERROR(cuda::RowsCrossEntropyCuda(
          lc, tc, mc, static_cast<float>(o.grad_scale), backward, start, &dzc, &acc, &flag));
#endif
    }
    if (!backward) continue;
    ORRERY_ASSIGN_OR_RETURN(Tensor dxc, dx->Slice(start, start + rows));
    ORRERY_RETURN_IF_ERROR(Matmul(dzc, w, {false, false, 1.0f, 0.0f}, &dxc));
    if (dw != nullptr) ORRERY_RETURN_IF_ERROR(Matmul(dzc, xc, {true, false, 1.0f, 1.0f}, dw));
  }
#if defined(ORRERY_KERNELS_CUDA)
  if (!cpu) return cuda::ReadLossCuda(acc, flag, targets, v, loss_sum);
#endif
  return Status::OK();
}

}  // namespace orrery::kernels
