// The CPU twin of QuantileThresholds, QuantileMargins and MarginKeyHistogram
// (kernels/moe_balancing.h): model::QuantileBalancingStep's margins and order statistics, in its
// operations.
#include "kernels/moe_balancing.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "kernels/cpu/moe_cpu.h"

namespace orrery::kernels {

Status QuantileMarginsCpu(const Tensor& scores, const Tensor& bias, int64_t k, bool exclusive,
                          Tensor* margins) {
  const int64_t m = scores.dim(0), n = scores.dim(1);
  const float* s = scores.data<float>();
  const float* b = bias.data<float>();
  double* out = margins->data<double>();
  std::vector<double> row(static_cast<size_t>(n)), sorted(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) row[j] = static_cast<double>(s[i * n + j]) + b[j];
    sorted = row;
    std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end(), std::greater<double>());
    const double tau_k1 = sorted[k];
    const double tau_k = *std::min_element(sorted.begin(), sorted.begin() + k);
    for (int64_t j = 0; j < n; ++j) {
      out[j * m + i] = !exclusive || row[j] > tau_k1 ? row[j] - tau_k1 : row[j] - tau_k;
    }
  }
  return Status::OK();
}

Status QuantileThresholdsCpu(const Tensor& scores, const Tensor& bias, int64_t k, bool exclusive,
                             Tensor* thresholds) {
  const int64_t m = scores.dim(0), n = scores.dim(1);
  Tensor margins = Tensor::Empty({n, m}, DType::kF64);
  ORRERY_RETURN_IF_ERROR(QuantileMarginsCpu(scores, bias, k, exclusive, &margins));
  const double q = static_cast<double>(m * k) / static_cast<double>(n);
  const int64_t r = std::min<int64_t>(m - 1, static_cast<int64_t>(std::ceil(q)));
  double* c = thresholds->data<double>();
  for (int64_t j = 0; j < n; ++j) {
    std::vector<double> col(margins.data<double>() + j * m, margins.data<double>() + (j + 1) * m);
    std::sort(col.begin(), col.end(), std::greater<double>());
    c[j] = exclusive ? 0.5 * (col[r - 1 >= 0 ? r - 1 : 0] + col[r]) : col[r];
  }
  return Status::OK();
}

Status MarginKeyHistogramCpu(const Tensor& margins, const Tensor& cols, const Tensor& prefixes,
                             int shift, Tensor* hist) {
  const int64_t m = margins.dim(1), queries = cols.numel();
  const uint64_t high = shift + 8 >= 64 ? 0 : ~uint64_t{0} << (shift + 8);
  int32_t* h = hist->data<int32_t>();
  std::fill(h, h + queries * 256, 0);
  for (int64_t i = 0; i < queries; ++i) {
    const double* col = margins.data<double>() + cols.data<int32_t>()[i] * m;
    const uint64_t prefix = static_cast<uint64_t>(prefixes.data<int64_t>()[i]) & high;
    for (int64_t t = 0; t < m; ++t) {
      const uint64_t key = OrderKey(col[t]);
      if ((key & high) == prefix) ++h[i * 256 + ((key >> shift) & 255u)];
    }
  }
  return Status::OK();
}

}  // namespace orrery::kernels
