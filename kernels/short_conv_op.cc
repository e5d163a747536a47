// ShortConvSilu / ShortConvSiluGrad: checks, then the CPU templates (kernels/cpu/short_conv.cc) or
// CUDA.
#include <string>
#include <vector>

#include "kernels/elementwise_check.h"
#include "kernels/phase_profile.h"
#include "kernels/short_conv.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "short_conv";
constexpr int64_t kMaxWidth = 16;

Status CheckInputs(const Tensor& x, const Tensor& w) {
  if (!x.defined() || x.ndim() != 2) {
    return InvalidArgumentError(std::string(kOp) + ": x " +
                                (x.defined() ? x.ToString() : "undefined") + ", expected 2-D");
  }
  const bool cpu = x.device().is_cpu();
  const DType dt = x.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(kOp) + ": x " + x.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  if (!w.defined() || w.ndim() != 2 || w.dim(0) != x.dim(1) || w.dim(1) < 1 ||
      w.dim(1) > kMaxWidth || w.dtype() != dt || !(w.device() == x.device())) {
    return InvalidArgumentError(
        std::string(kOp) + ": w " + (w.defined() ? w.ToString() : "undefined") + ", expected " +
        std::string(DTypeName(dt)) + "[" + std::to_string(x.dim(1)) +
        ", W] with 1 <= W <= " + std::to_string(kMaxWidth) + " on " + x.device().ToString());
  }
  return Status::OK();
}

// The documents' starts, checked on the host: i64 [docs + 1] on x's device, 0 = cu[0] <= ... <=
// cu[docs] = N; their host copy `cu_host` when defined, else cu read back.
StatusOr<std::vector<int64_t>> CheckedStarts(const Tensor& x, const Tensor& cu,
                                             const Tensor& cu_host) {
  if (!cu.defined() || cu.dtype() != DType::kI64 || cu.ndim() != 1 || cu.dim(0) < 2 ||
      !(cu.device() == x.device())) {
    return InvalidArgumentError(
        std::string(kOp) + ": cu_seqlens " + (cu.defined() ? cu.ToString() : "undefined") +
        ", expected i64 [docs + 1] with docs >= 1 on " + x.device().ToString());
  }
  if (cu_host.defined() && (cu_host.dtype() != DType::kI64 || cu_host.shape() != cu.shape() ||
                            !cu_host.device().is_cpu())) {
    return InvalidArgumentError(std::string(kOp) + ": cu_host " + cu_host.ToString() +
                                ", expected i64 [" + std::to_string(cu.dim(0)) + "] on cpu");
  }
  Tensor host = cu_host.defined() ? cu_host : cu;
  if (!host.device().is_cpu()) {
    ORRERY_ASSIGN_OR_RETURN(host, cu.To(Device::Cpu()));
  }
  std::vector<int64_t> starts(host.data<int64_t>(), host.data<int64_t>() + cu.dim(0));
  if (starts.front() != 0 || starts.back() != x.dim(0)) {
    return InvalidArgumentError(
        std::string(kOp) +
        ": cu_seqlens must start at 0 and end at N = " + std::to_string(x.dim(0)) + ", got " +
        std::to_string(starts.front()) + " .. " + std::to_string(starts.back()));
  }
  for (size_t i = 1; i < starts.size(); ++i) {
    if (starts[i] < starts[i - 1]) {
      return InvalidArgumentError(
          std::string(kOp) + ": cu_seqlens is not non-decreasing at index " + std::to_string(i));
    }
  }
  return starts;
}

}  // namespace

Status ShortConvSilu(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens, Tensor* y) {
  return ShortConvSilu(x, w, cu_seqlens, Tensor(), y);
}

Status ShortConvSilu(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                     const Tensor& cu_host, Tensor* y) {
  PhaseScope phase("op.short_conv_silu");
  ORRERY_RETURN_IF_ERROR(CheckInputs(x, w));
  ORRERY_ASSIGN_OR_RETURN(const std::vector<int64_t> cu, CheckedStarts(x, cu_seqlens, cu_host));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "y", x, y));
  if (x.numel() == 0) return Status::OK();
  const int64_t channels = x.dim(1), width = w.dim(1);
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::kF32) {
      ShortConvSiluForward<float>(x.data<float>(), channels, w.data<float>(), width, cu,
                                  y->data<float>());
    } else {
      ShortConvSiluForward<double>(x.data<double>(), channels, w.data<double>(), width, cu,
                                   y->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::ShortConvSiluForwardCuda(x, w, cu_seqlens, y);
#else
  return NoCuda(kOp, x);
#endif
}

Status ShortConvSiluGrad(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                         const Tensor& dy, Tensor* dx, Tensor* dw) {
  return ShortConvSiluGrad(x, w, cu_seqlens, Tensor(), dy, dx, dw);
}

Status ShortConvSiluGrad(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                         const Tensor& cu_host, const Tensor& dy, Tensor* dx, Tensor* dw) {
  PhaseScope phase("op.short_conv_silu_grad");
  ORRERY_RETURN_IF_ERROR(CheckInputs(x, w));
  ORRERY_ASSIGN_OR_RETURN(const std::vector<int64_t> cu, CheckedStarts(x, cu_seqlens, cu_host));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "dy", dy, x));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dx", x, dx));
  if (dw == nullptr) return InvalidArgumentError(std::string(kOp) + ": dw is null");
  const DType dw_type = x.device().is_cpu() ? x.dtype() : DType::kF32;
  if (!dw->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*dw, Tensor::Allocate(w.shape(), dw_type, x.device()));
    ORRERY_RETURN_IF_ERROR(dw->SetZero());
  }
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dw", w.shape(), dw_type, x.device(), dw));
  if (x.numel() == 0) return Status::OK();
  const int64_t channels = x.dim(1), width = w.dim(1);
  if (x.device().is_cpu()) {
    if (x.dtype() == DType::kF32) {
      ShortConvSiluBackward<float>(x.data<float>(), channels, w.data<float>(), width, cu,
                                   dy.data<float>(), dx->data<float>(), dw->data<float>());
    } else {
      ShortConvSiluBackward<double>(x.data<double>(), channels, w.data<double>(), width, cu,
                                    dy.data<double>(), dx->data<double>(), dw->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::ShortConvSiluBackwardCuda(x, w, cu_seqlens, dy, dx, dw);
#else
  return NoCuda(kOp, x);
#endif
}

Status ShortConvSiluDecode(const Tensor& x, const Tensor& w, const Tensor& rows, Tensor* hist,
                           Tensor* y) {
  PhaseScope phase("op.short_conv_silu_decode");
  ORRERY_RETURN_IF_ERROR(CheckInputs(x, w));
  const int64_t n = x.dim(0), channels = x.dim(1), width = w.dim(1);
  if (!rows.defined() || rows.dtype() != DType::kI32 || rows.shape() != Shape{n} ||
      !(rows.device() == x.device())) {
    return InvalidArgumentError(
        std::string(kOp) + ": rows " + (rows.defined() ? rows.ToString() : "undefined") +
        ", expected i32[" + std::to_string(n) + "] on " + x.device().ToString());
  }
  if (hist == nullptr) return InvalidArgumentError(std::string(kOp) + ": hist is null");
  if (width > 1 &&
      (!hist->defined() || hist->ndim() != 3 || hist->dim(1) != width - 1 ||
       hist->dim(2) != channels || hist->dtype() != x.dtype() || !(hist->device() == x.device()))) {
    return InvalidArgumentError(
        std::string(kOp) + ": hist " + (hist->defined() ? hist->ToString() : "undefined") +
        ", expected " + std::string(DTypeName(x.dtype())) + "[S, " + std::to_string(width - 1) +
        ", " + std::to_string(channels) + "] on " + x.device().ToString());
  }
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "y", x, y));
  if (n == 0) return Status::OK();
  if (x.device().is_cpu()) {
    const int32_t* r = rows.data<int32_t>();
    const int64_t table = width > 1 ? hist->dim(0) : 0;
    for (int64_t i = 0; i < n && width > 1; ++i) {
      if (r[i] >= table) {
        return InvalidArgumentError(
            std::string(kOp) + ": rows[" + std::to_string(i) + "] = " + std::to_string(r[i]) +
            " is outside the history table [0, " + std::to_string(table) + ")");
      }
    }
    if (x.dtype() == DType::kF32) {
      ShortConvSiluDecodeStep<float>(x.data<float>(), n, channels, w.data<float>(), width, r,
                                     width > 1 ? hist->data<float>() : nullptr, y->data<float>());
    } else {
      ShortConvSiluDecodeStep<double>(x.data<double>(), n, channels, w.data<double>(), width, r,
                                      width > 1 ? hist->data<double>() : nullptr,
                                      y->data<double>());
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::ShortConvSiluDecodeCuda(x, w, rows, hist, y);
#else
  return NoCuda(kOp, x);
#endif
}

}  // namespace orrery::kernels
