// SampleTokens (kernels/token_sampling.h): checks, then the CPU twin row by row or the CUDA
// kernel.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/token_sampling.h"
#include "kernels/elementwise_check.h"
#include "kernels/phase_profile.h"
#include "kernels/token_sampling.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {

Status SampleTokens(const Tensor& logits, const Tensor& params, Tensor* ids, Tensor* logprobs) {
  PhaseScope phase("op.sample_tokens");
  constexpr const char* kOp = "sample_tokens";
  if (!logits.defined() || logits.ndim() != 2 || logits.dtype() != DType::kF32 ||
      logits.dim(1) < 1) {
    return InvalidArgumentError(std::string(kOp) + ": logits " +
                                (logits.defined() ? logits.ToString() : "undefined") +
                                ", expected f32 [N, V] with V >= 1");
  }
  const int64_t n = logits.dim(0), v = logits.dim(1);
  const Device dev = logits.device();
  if (!params.defined() || params.dtype() != DType::kF64 || params.shape() != Shape{n, 3} ||
      !(params.device() == dev)) {
    return InvalidArgumentError(std::string(kOp) + ": params " +
                                (params.defined() ? params.ToString() : "undefined") +
                                ", expected f64[" + std::to_string(n) + ", 3] (temperature, " +
                                "top_p, u) on " + dev.ToString());
  }
  if (ids == nullptr || logprobs == nullptr) {
    return InvalidArgumentError(std::string(kOp) + ": ids and logprobs are required");
  }
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "ids", {n}, DType::kI32, dev, ids));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "logprobs", {n}, DType::kF32, dev, logprobs));
  if (n == 0) return Status::OK();
  if (dev.is_cpu()) {
    const double* pr = params.data<double>();
    for (int64_t i = 0; i < n; ++i) {
      const double t = pr[i * 3], top_p = pr[i * 3 + 1], u = pr[i * 3 + 2];
      if (!(t >= 0 && std::isfinite(t)) || !(top_p > 0 && top_p <= 1) || !(u >= 0 && u < 1)) {
        return InvalidArgumentError(std::string(kOp) + ": row " + std::to_string(i) +
                                    ": temperature " + std::to_string(t) + ", top_p " +
                                    std::to_string(top_p) + ", u " + std::to_string(u) +
                                    ", expected temperature >= 0, top_p in (0, 1], u in [0, 1)");
      }
    }
    std::vector<double> p(static_cast<size_t>(v));
    for (int64_t i = 0; i < n; ++i) {
      const cpu::SampledRow r = cpu::SampleRowCpu(logits.data<float>() + i * v, v, pr[i * 3],
                                                  pr[i * 3 + 1], pr[i * 3 + 2], p.data());
      ids->data<int32_t>()[i] = r.id;
      logprobs->data<float>()[i] = r.logprob;
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::SampleTokensCuda(logits, params, ids, logprobs);
#else
  return NoCuda(kOp, logits);
#endif
}

}  // namespace orrery::kernels
