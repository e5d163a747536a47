// Order statistics over the values of every rank of a data-parallel group, with nothing but a
// sum over ranks: the distributed quantile of Quantile Balancing (spec §5.4 step 6), so that
// ranks training on one global batch set their expert biases from the global batch's margins,
// not from an average of per-rank biases.
//
// Histogram descent: each column's value interval is cut into kBins bins; the ranks' bin counts
// are summed; the bin that holds the wanted rank becomes the next interval (the counts above it
// are carried). When that bin holds at most kCandidates values over all ranks, the ranks gather
// them (per-rank counts, then the values, each in its own slice of a summed buffer) and the
// answer is exact: the same number a sort of every rank's values would give. After kPasses
// narrowing passes a bin still holding more (ties, or values closer than the double resolution
// of the interval) gives its largest value, within (hi - lo) / kBins^kPasses of the answer.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"

namespace orrery::model {

// The ranks that share one global batch. `sum` adds a buffer over every rank in place (the
// Communicator's AllReduceSum); every rank calls the functions below with the same shapes in the
// same order. The default is one rank, for which no sum is needed.
struct RankGroup {
  int rank = 0;
  int world = 1;
  std::function<Status(std::span<double>)> sum;
};

struct OrderStatisticsOptions {
  int bins = 256;
  int passes = 4;
  int64_t candidates = 64;  // gathered exactly when at most this many share the final bin
};

// columns[c]: this rank's values of column c, all within [lo[c], hi[c]]; targets[c]: a 1-based
// rank from the top, 1 <= targets[c] <= the number of values of column c over all ranks. Returns
// the targets[c]-th largest value of each column over all ranks.
StatusOr<std::vector<double>> GlobalOrderStatistics(const std::vector<std::vector<double>>& columns,
                                                    const std::vector<double>& lo,
                                                    const std::vector<double>& hi,
                                                    const std::vector<int64_t>& targets,
                                                    const RankGroup& group,
                                                    const OrderStatisticsOptions& options = {});

}  // namespace orrery::model
