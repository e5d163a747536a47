// The CPU twin of QuantileThresholds (kernels/moe_balancing.h): model::QuantileBalancingStep's
// margins and order statistics, in its operations.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "kernels/cpu/moe_cpu.h"

namespace orrery::kernels {

Status QuantileThresholdsCpu(const Tensor& scores, const Tensor& bias, int64_t k, bool exclusive,
                             Tensor* thresholds) {
  const int64_t m = scores.dim(0), n = scores.dim(1);
  const float* s = scores.data<float>();
  const float* b = bias.data<float>();
  std::vector<std::vector<double>> cols(static_cast<size_t>(n));
  for (auto& col : cols) col.reserve(static_cast<size_t>(m));
  std::vector<double> row(static_cast<size_t>(n)), sorted(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) row[j] = static_cast<double>(s[i * n + j]) + b[j];
    sorted = row;
    std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end(), std::greater<double>());
    const double tau_k1 = sorted[k];
    const double tau_k = *std::min_element(sorted.begin(), sorted.begin() + k);
    for (int64_t j = 0; j < n; ++j) {
      cols[j].push_back(!exclusive || row[j] > tau_k1 ? row[j] - tau_k1 : row[j] - tau_k);
    }
  }
  const double q = static_cast<double>(m * k) / static_cast<double>(n);
  const int64_t r = std::min<int64_t>(m - 1, static_cast<int64_t>(std::ceil(q)));
  double* c = thresholds->data<double>();
  for (int64_t j = 0; j < n; ++j) {
    std::vector<double>& col = cols[j];
    std::sort(col.begin(), col.end(), std::greater<double>());
    c[j] = exclusive ? 0.5 * (col[r - 1 >= 0 ? r - 1 : 0] + col[r]) : col[r];
  }
  return Status::OK();
}

}  // namespace orrery::kernels
