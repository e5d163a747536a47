#include "model/quantile_balancing.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/moe.h"
#include "kernels/moe_balancing.h"
#include "model/global_order_statistics.h"
#include "model/layers.h"

namespace orrery::model {
namespace {

// Load per expert / q when routing `s` [m, n] by top-k of s + b.
std::vector<double> Loads(const std::vector<float>& s, int64_t m, int64_t n, int64_t k,
                          const float* b, double q) {
  std::vector<int32_t> ids(static_cast<size_t>(m * k));
  SelectTopK(s.data(), b, m, n, k, ids.data());
  std::vector<double> load(static_cast<size_t>(n), 0.0);
  for (int32_t id : ids) load[id] += 1.0;
  for (double& l : load) l /= q;
  return load;
}

// Load per expert / q when routing `s` [m, n] (on its device) by top-k of s + b.
StatusOr<std::vector<double>> LoadsWhereScoresAre(const Tensor& s, const Tensor& b, int64_t k,
                                                  double q) {
  ORRERY_ASSIGN_OR_RETURN(Tensor bd, b.To(s.device()));
  Tensor ids, weights;
  ORRERY_RETURN_IF_ERROR(kernels::RouteTopK(s, bd, Tensor(), k, 1.0, &ids, &weights));
  ORRERY_ASSIGN_OR_RETURN(Tensor host_ids, ids.To(Device::Cpu()));
  std::vector<double> load(static_cast<size_t>(s.dim(1)), 0.0);
  const int32_t* id = host_ids.data<int32_t>();
  for (int64_t i = 0; i < host_ids.numel(); ++i) load[id[i]] += 1.0;
  for (double& l : load) l /= q;
  return load;
}

double MaxViolation(const std::vector<double>& load) {
  return *std::max_element(load.begin(), load.end()) - 1.0;
}

// Sums `v` over the group's ranks (a no-op for one rank).
Status SumOverRanks(const RankGroup& group, std::vector<double>* v) {
  if (group.world <= 1) return Status::OK();
  return group.sum(std::span<double>(v->data(), v->size()));
}

// Loads as Loads over every rank's rows: the counts summed, then divided by the global q.
StatusOr<std::vector<double>> GlobalLoads(const std::vector<float>& s, int64_t m, int64_t n,
                                          int64_t k, const float* b, double q,
                                          const RankGroup& group) {
  std::vector<double> load = Loads(s, m, n, k, b, 1.0);
  ORRERY_RETURN_IF_ERROR(SumOverRanks(group, &load));
  for (double& l : load) l /= q;
  return load;
}

// The targets[i]-th largest (1-based, over every rank's rows: mg in all) value of column cols[i] of
// margins f64 [n, m] (where the scores are), exactly: an 8-pass radix select over the values'
// order keys (kernels/moe_balancing.h), each pass's 256-bin counts summed over the group.
StatusOr<std::vector<double>> GlobalMarginSelect(const Tensor& margins,
                                                 const std::vector<int32_t>& cols,
                                                 const std::vector<int64_t>& targets, int64_t mg,
                                                 const RankGroup& group) {
  const int64_t nq = static_cast<int64_t>(cols.size());
  const Device dev = margins.device();
  ORRERY_ASSIGN_OR_RETURN(const Tensor cols_dev, Tensor::FromVector<int32_t>({nq}, cols).To(dev));
  // Ascending rank still to find inside the current prefix, and the key bits found so far.
  std::vector<int64_t> rank(static_cast<size_t>(nq));
  for (int64_t i = 0; i < nq; ++i) rank[i] = mg - targets[i];
  std::vector<int64_t> prefix(static_cast<size_t>(nq), 0);
  for (int shift = 56; shift >= 0; shift -= 8) {
    ORRERY_ASSIGN_OR_RETURN(const Tensor prefix_dev,
                            Tensor::FromVector<int64_t>({nq}, prefix).To(dev));
    Tensor hist;
    ORRERY_RETURN_IF_ERROR(
        kernels::MarginKeyHistogram(margins, cols_dev, prefix_dev, shift, &hist));
    ORRERY_ASSIGN_OR_RETURN(const Tensor host, hist.To(Device::Cpu()));
    std::vector<double> counts(host.data<int32_t>(), host.data<int32_t>() + nq * 256);
    ORRERY_RETURN_IF_ERROR(SumOverRanks(group, &counts));
    for (int64_t i = 0; i < nq; ++i) {
      const double* h = counts.data() + i * 256;
      double below = 0;
      int b = 0;
      while (b < 255 && below + h[b] <= static_cast<double>(rank[i])) below += h[b++];
      if (below + h[b] <= static_cast<double>(rank[i])) {
        return InternalError("quantile balancing: the ranks' margins of column " +
                             std::to_string(cols[i]) + " hold fewer than " +
                             std::to_string(targets[i]) + " values");
      }
      rank[i] -= static_cast<int64_t>(below);
      prefix[i] = static_cast<int64_t>(static_cast<uint64_t>(prefix[i]) |
                                       (static_cast<uint64_t>(b) << shift));
    }
  }
  std::vector<double> out(static_cast<size_t>(nq));
  for (int64_t i = 0; i < nq; ++i) out[i] = kernels::FromOrderKey(static_cast<uint64_t>(prefix[i]));
  return out;
}

// b_j <- b_j - eta c_j, re-centred, in f64 then rounded once to f32 (QuantileBalancingStep's
// update); the sum of |delta b| into the result.
void ApplyThresholds(const double* c, const MoeConfig& config, float* b,
                     QuantileBalancingResult* result) {
  const int64_t n = config.num_experts;
  double mean = 0;
  for (int64_t j = 0; j < n; ++j) mean += b[j] - config.balancing_step * c[j];
  mean /= static_cast<double>(n);
  result->bias_change = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float nb = static_cast<float>(b[j] - config.balancing_step * c[j] - mean);
    result->bias_change += std::abs(nb - b[j]);
    b[j] = nb;
  }
}

}  // namespace

Status QuantileBalancingStep(const std::vector<const Tensor*>& scores, const MoeConfig& config,
                             Tensor* bias, QuantileBalancingResult* result,
                             const RankGroup& group) {
  const int64_t n = config.num_experts, k = config.top_k;
  if (bias->dtype() != DType::kF32 || bias->numel() != n) {
    return InvalidArgumentError("quantile balancing: bias must be f32 [" + std::to_string(n) + "]");
  }
  std::vector<float> s;
  for (const Tensor* t : scores) {
    if (t->dtype() != DType::kF32 || t->ndim() != 2 || t->dim(1) != n) {
      return InvalidArgumentError("quantile balancing: scores must be f32 [m, " +
                                  std::to_string(n) + "], got " + t->ToString());
    }
    s.insert(s.end(), t->data<float>(), t->data<float>() + t->numel());
  }
  const int64_t m = static_cast<int64_t>(s.size()) / n;
  // The global batch: every rank's rows (the quantiles and loads are over all of them).
  std::vector<double> rows_total = {static_cast<double>(m)};
  ORRERY_RETURN_IF_ERROR(SumOverRanks(group, &rows_total));
  const auto mg = static_cast<int64_t>(rows_total[0]);
  if (mg == 0 || k >= n) return Status::OK();
  float* b = bias->data<float>();
  const double q = static_cast<double>(mg * k) / static_cast<double>(n);
  ORRERY_ASSIGN_OR_RETURN(result->load, GlobalLoads(s, m, n, k, b, q, group));
  result->max_violation_before = MaxViolation(result->load);

  // Margins per expert column.
  std::vector<std::vector<double>> cols(static_cast<size_t>(n));
  for (auto& col : cols) col.reserve(static_cast<size_t>(m));
  std::vector<double> row(static_cast<size_t>(n)), sorted(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) row[j] = static_cast<double>(s[i * n + j]) + b[j];
    sorted = row;
    std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end(), std::greater<double>());
    const double tau_k1 = sorted[k];                                             // (k+1)-th largest
    const double tau_k = *std::min_element(sorted.begin(), sorted.begin() + k);  // k-th largest
    for (int64_t j = 0; j < n; ++j) {
      double margin;
      if (config.balancing == Balancing::kQuantileCutoff) {
        margin = row[j] - tau_k1;
      } else {
        // Selected (above the (k+1)-th) measures to the (k+1)-th, the rest to the k-th.
        margin = row[j] > tau_k1 ? row[j] - tau_k1 : row[j] - tau_k;
      }
      cols[j].push_back(margin);
    }
  }
  const int64_t qi = std::min<int64_t>(mg - 1, static_cast<int64_t>(std::ceil(q)));
  const bool cutoff = config.balancing == Balancing::kQuantileCutoff;
  // c_j from the (qi+1)-th largest margin of column j (cut-off), or the midpoint of the qi-th and
  // (qi+1)-th (exclusive; the (qi+1)-th alone when qi = 0).
  std::vector<double> upper(static_cast<size_t>(n)), lower(static_cast<size_t>(n));
  if (group.world <= 1) {
    for (int64_t j = 0; j < n; ++j) {
      std::vector<double>& col = cols[j];
      std::sort(col.begin(), col.end(), std::greater<double>());
      lower[j] = col[qi];
      upper[j] = col[qi - 1 >= 0 ? qi - 1 : 0];
    }
  } else {
    // Every margin lies in [b_j - 1 - max b, 1 + b_j - min b] (scores in [0, 1], cut-offs are
    // biased scores of the row): the intervals need no communication.
    const double bmax = *std::max_element(b, b + n), bmin = *std::min_element(b, b + n);
    std::vector<std::vector<double>> columns;
    std::vector<double> lo, hi;
    std::vector<int64_t> targets;
    for (int pick = 0; pick < (cutoff ? 1 : 2); ++pick) {
      for (int64_t j = 0; j < n; ++j) {
        columns.push_back(cols[j]);
        lo.push_back(b[j] - 1.0 - bmax - 1e-3);
        hi.push_back(1.0 + b[j] - bmin + 1e-3);
        targets.push_back(pick == 0 ? qi + 1 : std::max<int64_t>(qi, 1));
      }
    }
    ORRERY_ASSIGN_OR_RETURN(std::vector<double> v,
                            GlobalOrderStatistics(columns, lo, hi, targets, group));
    for (int64_t j = 0; j < n; ++j) {
      lower[j] = v[j];
      upper[j] = cutoff ? v[j] : v[n + j];
    }
  }
  std::vector<double> delta(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const double c = cutoff ? lower[j] : 0.5 * (upper[j] + lower[j]);
    delta[j] = -config.balancing_step * c;
  }
  double mean = 0;
  for (int64_t j = 0; j < n; ++j) mean += b[j] + delta[j];
  mean /= static_cast<double>(n);
  result->bias_change = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float nb = static_cast<float>(b[j] + delta[j] - mean);
    result->bias_change += std::abs(nb - b[j]);
    b[j] = nb;
  }
  ORRERY_ASSIGN_OR_RETURN(std::vector<double> after, GlobalLoads(s, m, n, k, b, q, group));
  result->max_violation_after = MaxViolation(after);
  return Status::OK();
}

Status QuantileBalancingStepWhereScoresAre(const std::vector<Tensor>& scores,
                                           const MoeConfig& config, Tensor* bias,
                                           QuantileBalancingResult* result,
                                           const RankGroup& group) {
  const int64_t n = config.num_experts, k = config.top_k;
  if (bias->dtype() != DType::kF32 || bias->numel() != n || !bias->device().is_cpu()) {
    return InvalidArgumentError("quantile balancing: bias must be f32 [" + std::to_string(n) +
                                "] on the cpu");
  }
  // A rank without scores still takes part in a group's step (every rank sums every buffer).
  if (scores.empty() && group.world <= 1) return Status::OK();
  const std::vector<Tensor> none = {Tensor::Empty({0, n}, DType::kF32)};
  const std::vector<Tensor>& parts = scores.empty() ? none : scores;
  int64_t m = 0;
  for (const Tensor& t : parts) {
    if (t.dtype() != DType::kF32 || t.ndim() != 2 || t.dim(1) != n ||
        !(t.device() == parts[0].device())) {
      return InvalidArgumentError("quantile balancing: scores must be f32 [m, " +
                                  std::to_string(n) + "] on one device, got " + t.ToString());
    }
    m += t.dim(0);
  }
  // The global batch: every rank's rows (the quantiles and loads are over all of them).
  std::vector<double> rows_total = {static_cast<double>(m)};
  ORRERY_RETURN_IF_ERROR(SumOverRanks(group, &rows_total));
  const auto mg = static_cast<int64_t>(rows_total[0]);
  if (mg == 0 || k >= n) return Status::OK();
  const Device dev = parts[0].device();
  Tensor all = parts[0];
  if (parts.size() > 1) {  // the micro-batches side by side: the quantiles are over all of them
    ORRERY_ASSIGN_OR_RETURN(all, Tensor::Allocate({m, n}, DType::kF32, dev));
    int64_t row = 0;
    for (const Tensor& t : parts) {
      ORRERY_ASSIGN_OR_RETURN(Tensor dst, all.Slice(row, row + t.dim(0)));
      ORRERY_RETURN_IF_ERROR(dst.CopyFrom(t));
      row += t.dim(0);
    }
  }
  const double q = static_cast<double>(mg * k) / static_cast<double>(n);
  // Loads: this rank's counts, summed over the group, over the global q.
  auto global_loads = [&]() -> StatusOr<std::vector<double>> {
    std::vector<double> load(static_cast<size_t>(n), 0.0);
    if (m > 0) {
      ORRERY_ASSIGN_OR_RETURN(load, LoadsWhereScoresAre(all, *bias, k, 1.0));
    }
    ORRERY_RETURN_IF_ERROR(SumOverRanks(group, &load));
    for (double& l : load) l /= q;
    return load;
  };
  ORRERY_ASSIGN_OR_RETURN(result->load, global_loads());
  result->max_violation_before = MaxViolation(result->load);
  ORRERY_ASSIGN_OR_RETURN(Tensor bd, bias->To(dev));
  const bool exclusive = config.balancing == Balancing::kQuantileExclusive;
  std::vector<double> c(static_cast<size_t>(n));
  if (group.world <= 1) {
    Tensor cd;
    ORRERY_RETURN_IF_ERROR(kernels::QuantileThresholds(all, bd, k, exclusive, &cd));
    ORRERY_ASSIGN_OR_RETURN(Tensor ch, cd.To(Device::Cpu()));
    std::copy_n(ch.data<double>(), n, c.begin());
  } else {
    // Several ranks (spec §5.4 step 6): the same order statistics over the global batch, by a
    // radix select whose histograms are summed over the ranks; only counts cross the group.
    Tensor margins;
    ORRERY_RETURN_IF_ERROR(kernels::QuantileMargins(all, bd, k, exclusive, &margins));
    const int64_t qi = std::min<int64_t>(mg - 1, static_cast<int64_t>(std::ceil(q)));
    std::vector<int32_t> cols;
    std::vector<int64_t> targets;
    for (int pick = 0; pick < (exclusive ? 2 : 1); ++pick) {
      for (int64_t j = 0; j < n; ++j) {
        cols.push_back(static_cast<int32_t>(j));
        targets.push_back(pick == 0 ? qi + 1 : std::max<int64_t>(qi, 1));
      }
    }
    ORRERY_ASSIGN_OR_RETURN(std::vector<double> v,
                            GlobalMarginSelect(margins, cols, targets, mg, group));
    for (int64_t j = 0; j < n; ++j) c[j] = exclusive ? 0.5 * (v[n + j] + v[j]) : v[j];
  }
  ApplyThresholds(c.data(), config, bias->data<float>(), result);
  ORRERY_ASSIGN_OR_RETURN(std::vector<double> after, global_loads());
  result->max_violation_after = MaxViolation(after);
  return Status::OK();
}

}  // namespace orrery::model
