#include "learner/cross_entropy.h"

#include <cmath>

#include "core/thread_pool.h"

namespace orrery {

StatusOr<LossSum> CrossEntropy(const Tensor& logits, const std::vector<int32_t>& targets,
                               double grad_scale, Tensor* dlogits) {
  if (logits.ndim() != 2 || logits.dtype() != DType::kF32 || !logits.device().is_cpu()) {
    return InvalidArgumentError("cross entropy: logits must be f32 [N, V] on the CPU, got " +
                                logits.ToString());
  }
  const int64_t n = logits.dim(0), v = logits.dim(1);
  if (static_cast<int64_t>(targets.size()) != n) {
    return InvalidArgumentError("cross entropy: " + std::to_string(targets.size()) +
                                " targets for " + std::to_string(n) + " rows");
  }
  for (int32_t t : targets) {
    if (t >= v) return OutOfRangeError("cross entropy: target " + std::to_string(t) + " >= vocab");
  }
  if (dlogits != nullptr) *dlogits = Tensor::Zeros({n, v}, DType::kF32);
  const float* z = logits.data<float>();
  float* dz = dlogits != nullptr ? dlogits->data<float>() : nullptr;
  std::vector<double> row_loss(n, 0.0);
  ThreadPool::Default().ParallelFor(n, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int32_t t = targets[i];
      if (t < 0) continue;
      const float* zi = z + i * v;
      float mx = zi[0];
      for (int64_t j = 1; j < v; ++j) mx = std::max(mx, zi[j]);
      double sum = 0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(zi[j] - mx));
      const double lse = mx + std::log(sum);
      row_loss[i] = lse - zi[t];
      if (dz != nullptr) {
        float* di = dz + i * v;
        for (int64_t j = 0; j < v; ++j) {
          di[j] = static_cast<float>(grad_scale * std::exp(static_cast<double>(zi[j]) - lse));
        }
        di[t] -= static_cast<float>(grad_scale);
      }
    }
  });
  LossSum out;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] >= 0) {
      out.loss_sum += row_loss[i];
      ++out.tokens;
    }
  }
  return out;
}

}  // namespace orrery
