// QuantileThresholds (kernels/moe_balancing.h): checks, then the CPU twin or CUDA.
#include <string>

#include "kernels/cpu/moe_cpu.h"
#include "kernels/elementwise_check.h"
#include "kernels/moe.h"
#include "kernels/moe_balancing.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/moe_cuda.h"
#endif

namespace orrery::kernels {

Status QuantileThresholds(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                          Tensor* thresholds) {
  PhaseScope phase("op.quantile_thresholds");
  constexpr const char* kOp = "quantile_thresholds";
  if (!scores.defined() || scores.ndim() != 2 || scores.dtype() != DType::kF32 ||
      scores.dim(0) < 1 || scores.dim(1) < 2 || scores.dim(1) > kMaxExperts) {
    return InvalidArgumentError(
        std::string(kOp) + ": scores " + (scores.defined() ? scores.ToString() : "undefined") +
        ", expected f32 [m >= 1, n] with 2 <= n <= " + std::to_string(kMaxExperts));
  }
  const int64_t n = scores.dim(1);
  const Device dev = scores.device();
  if (top_k < 1 || top_k >= n || top_k > kMaxTopK) {
    return InvalidArgumentError(std::string(kOp) + ": top_k " + std::to_string(top_k) +
                                ", expected 1 to min(n - 1 = " + std::to_string(n - 1) + ", " +
                                std::to_string(kMaxTopK) + ")");
  }
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "bias", bias, {n}, DType::kF32, dev));
  if (thresholds == nullptr)
    return InvalidArgumentError(std::string(kOp) + ": thresholds is required");
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "thresholds", {n}, DType::kF64, dev, thresholds));
  if (dev.is_cpu()) return QuantileThresholdsCpu(scores, bias, top_k, exclusive, thresholds);
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::QuantileThresholdsCuda(scores, bias, top_k, exclusive, thresholds);
#else
  return NoCuda(kOp, scores);
#endif
}

}  // namespace orrery::kernels
