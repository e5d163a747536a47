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
namespace {

// The checks both statistics make of their inputs: scores f32 [m >= min_rows, n] with
// 2 <= n <= kMaxExperts, 1 <= top_k <= min(n - 1, kMaxTopK), bias f32 [n] on the same device.
Status CheckScoresAndBias(const char* op, const Tensor& scores, const Tensor& bias, int64_t top_k,
                          int64_t min_rows) {
  if (!scores.defined() || scores.ndim() != 2 || scores.dtype() != DType::kF32 ||
      scores.dim(0) < min_rows || scores.dim(1) < 2 || scores.dim(1) > kMaxExperts) {
    return InvalidArgumentError(
        std::string(op) + ": scores " + (scores.defined() ? scores.ToString() : "undefined") +
        ", expected f32 [" +
        (min_rows > 0 ? "m >= " + std::to_string(min_rows) : std::string("m")) +
        ", n] with 2 <= n <= " + std::to_string(kMaxExperts));
  }
  const int64_t n = scores.dim(1);
  if (top_k < 1 || top_k >= n || top_k > kMaxTopK) {
    return InvalidArgumentError(std::string(op) + ": top_k " + std::to_string(top_k) +
                                ", expected 1 to min(n - 1 = " + std::to_string(n - 1) + ", " +
                                std::to_string(kMaxTopK) + ")");
  }
  return ExpectAs(op, "bias", bias, {n}, DType::kF32, scores.device());
}

}  // namespace

Status QuantileThresholds(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                          Tensor* thresholds) {
  PhaseScope phase("op.quantile_thresholds");
  constexpr const char* kOp = "quantile_thresholds";
  ORRERY_RETURN_IF_ERROR(CheckScoresAndBias(kOp, scores, bias, top_k, /*min_rows=*/1));
  const int64_t n = scores.dim(1);
  const Device dev = scores.device();
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

Status QuantileMargins(const Tensor& scores, const Tensor& bias, int64_t top_k, bool exclusive,
                       Tensor* margins) {
  PhaseScope phase("op.quantile_margins");
  constexpr const char* kOp = "quantile_margins";
  ORRERY_RETURN_IF_ERROR(CheckScoresAndBias(kOp, scores, bias, top_k, /*min_rows=*/0));
  const int64_t m = scores.dim(0), n = scores.dim(1);
  const Device dev = scores.device();
  if (margins == nullptr) return InvalidArgumentError(std::string(kOp) + ": margins is required");
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "margins", {n, m}, DType::kF64, dev, margins));
  if (m == 0) return Status::OK();
  if (dev.is_cpu()) return QuantileMarginsCpu(scores, bias, top_k, exclusive, margins);
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::QuantileMarginsCuda(scores, bias, top_k, exclusive, margins);
#else
  return NoCuda(kOp, scores);
#endif
}

Status MarginKeyHistogram(const Tensor& margins, const Tensor& cols, const Tensor& prefixes,
                          int shift, Tensor* hist) {
  PhaseScope phase("op.margin_key_histogram");
  constexpr const char* kOp = "margin_key_histogram";
  if (!margins.defined() || margins.ndim() != 2 || margins.dtype() != DType::kF64) {
    return InvalidArgumentError(std::string(kOp) + ": margins " +
                                (margins.defined() ? margins.ToString() : "undefined") +
                                ", expected f64 [n, m]");
  }
  const Device dev = margins.device();
  if (!cols.defined() || cols.ndim() != 1) {
    return InvalidArgumentError(std::string(kOp) + ": cols must be i32 [Q]");
  }
  const int64_t queries = cols.numel();
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "cols", cols, {queries}, DType::kI32, dev));
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "prefixes", prefixes, {queries}, DType::kI64, dev));
  if (shift < 0 || shift > 56 || shift % 8 != 0) {
    return InvalidArgumentError(std::string(kOp) + ": shift " + std::to_string(shift) +
                                ", expected one of 56, 48, ..., 0");
  }
  if (hist == nullptr) return InvalidArgumentError(std::string(kOp) + ": hist is required");
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "hist", {queries, 256}, DType::kI32, dev, hist));
  if (dev.is_cpu()) {
    for (int64_t i = 0; i < queries; ++i) {
      const int32_t c = cols.data<int32_t>()[i];
      if (c < 0 || c >= margins.dim(0)) {
        return InvalidArgumentError(std::string(kOp) + ": cols[" + std::to_string(i) +
                                    "] = " + std::to_string(c) + ", expected [0, " +
                                    std::to_string(margins.dim(0)) + ")");
      }
    }
    return MarginKeyHistogramCpu(margins, cols, prefixes, shift, hist);
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::MarginKeyHistogramCuda(margins, cols, prefixes, shift, hist);
#else
  return NoCuda(kOp, margins);
#endif
}

}  // namespace orrery::kernels
