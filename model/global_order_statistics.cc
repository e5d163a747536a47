#include "model/global_order_statistics.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

namespace orrery::model {
namespace {

Status Sum(const RankGroup& g, std::vector<double>* v) {
  if (g.world <= 1) return Status::OK();
  return g.sum(std::span<double>(v->data(), v->size()));
}

// The bin of v in [lo, hi] cut into `bins`: the same arithmetic on every rank.
int BinOf(double v, double lo, double hi, int bins) {
  if (!(hi > lo)) return 0;
  const double x = (v - lo) / (hi - lo) * bins;
  return std::clamp(static_cast<int>(std::floor(x)), 0, bins - 1);
}

}  // namespace

StatusOr<std::vector<double>> GlobalOrderStatistics(const std::vector<std::vector<double>>& columns,
                                                    const std::vector<double>& lo,
                                                    const std::vector<double>& hi,
                                                    const std::vector<int64_t>& targets,
                                                    const RankGroup& group,
                                                    const OrderStatisticsOptions& options) {
  const size_t nc = columns.size();
  if (lo.size() != nc || hi.size() != nc || targets.size() != nc) {
    return InvalidArgumentError("order statistics: columns, lo, hi and targets differ in length");
  }
  if (group.world > 1 && (!group.sum || group.rank < 0 || group.rank >= group.world)) {
    return InvalidArgumentError("order statistics: rank " + std::to_string(group.rank) + " of " +
                                std::to_string(group.world) + " without a sum over ranks");
  }
  const int bins = std::max(2, options.bins);
  // Per column: the local candidates (values inside the current bin), the interval, the count of
  // values above it over all ranks, and the candidates' count over all ranks.
  std::vector<std::vector<double>> cand(columns);
  std::vector<double> cur_lo(lo), cur_hi(hi), above(nc, 0.0), total(nc, 0.0);
  {
    std::vector<double> n(nc);
    for (size_t c = 0; c < nc; ++c) n[c] = static_cast<double>(cand[c].size());
    ORRERY_RETURN_IF_ERROR(Sum(group, &n));
    for (size_t c = 0; c < nc; ++c) {
      total[c] = n[c];
      if (targets[c] < 1 || static_cast<double>(targets[c]) > n[c]) {
        return InvalidArgumentError("order statistics: column " + std::to_string(c) +
                                    " asks for rank " + std::to_string(targets[c]) + " of " +
                                    std::to_string(static_cast<int64_t>(n[c])) + " values");
      }
    }
  }
  std::vector<bool> done(nc, false);
  for (int pass = 0; pass < options.passes; ++pass) {
    for (size_t c = 0; c < nc; ++c) {
      done[c] = done[c] || total[c] <= static_cast<double>(options.candidates);
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    std::vector<double> counts(nc * bins, 0.0);
    for (size_t c = 0; c < nc; ++c) {
      if (done[c]) continue;
      for (double v : cand[c]) counts[c * bins + BinOf(v, cur_lo[c], cur_hi[c], bins)] += 1.0;
    }
    ORRERY_RETURN_IF_ERROR(Sum(group, &counts));
    for (size_t c = 0; c < nc; ++c) {
      if (done[c]) continue;
      int b = bins - 1;
      double cum = above[c];
      for (; b > 0; --b) {
        if (cum + counts[c * bins + b] >= static_cast<double>(targets[c])) break;
        cum += counts[c * bins + b];
      }
      above[c] = cum;
      total[c] = counts[c * bins + b];
      const double l = cur_lo[c], h = cur_hi[c];
      std::erase_if(cand[c], [&](double v) { return BinOf(v, l, h, bins) != b; });
      const double w = (h - l) / bins;
      cur_lo[c] = l + b * w;
      cur_hi[c] = b == bins - 1 ? h : l + (b + 1) * w;
    }
  }
  // Gather: per-rank counts (each rank in its own slice), then the values.
  const int world = std::max(1, group.world), me = group.world > 1 ? group.rank : 0;
  std::vector<double> per_rank(static_cast<size_t>(world) * nc, 0.0);
  std::vector<bool> exact(nc);
  for (size_t c = 0; c < nc; ++c) {
    exact[c] = total[c] <= static_cast<double>(options.candidates);
    per_rank[me * nc + c] = exact[c] ? static_cast<double>(cand[c].size()) : 0.0;
  }
  ORRERY_RETURN_IF_ERROR(Sum(group, &per_rank));
  std::vector<size_t> start(nc + 1, 0), mine(nc, 0);
  for (size_t c = 0; c < nc; ++c) {
    size_t col = 0;
    for (int r = 0; r < world; ++r) {
      if (r == me) mine[c] = start[c] + col;
      col += static_cast<size_t>(per_rank[r * nc + c]);
    }
    start[c + 1] = start[c] + col;
  }
  // Exact columns put their candidates in their slices; the others their largest candidate in a
  // per-rank slot (with a presence flag), so every rank learns the final bin's maximum.
  std::vector<double> values(start[nc], 0.0), maxima(static_cast<size_t>(world) * nc, 0.0),
      present(static_cast<size_t>(world) * nc, 0.0);
  for (size_t c = 0; c < nc; ++c) {
    if (exact[c]) {
      std::copy(cand[c].begin(), cand[c].end(), values.begin() + static_cast<long>(mine[c]));
    } else if (!cand[c].empty()) {
      maxima[me * nc + c] = *std::max_element(cand[c].begin(), cand[c].end());
      present[me * nc + c] = 1.0;
    }
  }
  ORRERY_RETURN_IF_ERROR(Sum(group, &values));
  ORRERY_RETURN_IF_ERROR(Sum(group, &maxima));
  ORRERY_RETURN_IF_ERROR(Sum(group, &present));
  std::vector<double> out(nc);
  for (size_t c = 0; c < nc; ++c) {
    if (!exact[c]) {
      double best = -HUGE_VAL;
      for (int r = 0; r < world; ++r) {
        if (present[r * nc + c] > 0) best = std::max(best, maxima[r * nc + c]);
      }
      out[c] = best;
      continue;
    }
    std::vector<double> col(values.begin() + static_cast<long>(start[c]),
                            values.begin() + static_cast<long>(start[c + 1]));
    std::sort(col.begin(), col.end(), std::greater<double>());
    const int64_t at = targets[c] - static_cast<int64_t>(above[c]) - 1;
    if (at < 0 || at >= static_cast<int64_t>(col.size())) {
      return InternalError("order statistics: column " + std::to_string(c) +
                           ": the ranks disagree on its values (rank " +
                           std::to_string(targets[c]) + ", " + std::to_string(col.size()) +
                           " candidates below " + std::to_string(above[c]) + ")");
    }
    out[c] = col[static_cast<size_t>(at)];
  }
  return out;
}

}  // namespace orrery::model
