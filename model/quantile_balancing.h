// Quantile Balancing (spec §5.4): sets the expert selection biases b from order statistics of the
// router scores so that every expert receives its target load q = m*k/n on the batch.
//
//   cut-off form (public, Su 2026):  margin m_ij = s_ij + b_j - alpha_i, alpha_i the (k+1)-th
//                                    largest of row i; c_j = the (q+1)-th largest of column j.
//   exclusive form (our proposal):   m_ij = s_ij + b_j - (tau_i^{k+1} if j is selected else
//                                    tau_i^k), so m_ij > 0 iff selected with no structural zero;
//                                    c_j = midpoint of the q-th and (q+1)-th largest of column j.
//   b_j <- b_j - eta * c_j, then b <- b - mean(b) (routing is invariant to a common shift).
#pragma once

#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/global_order_statistics.h"

namespace orrery::model {

struct QuantileBalancingResult {
  std::vector<double> load;         // per expert, load / q under the biases before the update
  double max_violation_before = 0;  // max_j load_j / q - 1
  double max_violation_after = 0;   // the same batch re-routed with the new biases
  double bias_change = 0;           // sum_j |delta b_j|
};

// scores: f32 [m_i, n] unbiased router scores of each micro-batch; bias f32 [n] updated in place.
// With a group of several ranks (each passing its own micro-batches, all the same bias), the
// step is the one of the global batch — q, the quantiles and the loads over every rank's rows
// (spec §5.4 step 6, through GlobalOrderStatistics) — so the ranks' biases stay identical.
Status QuantileBalancingStep(const std::vector<const Tensor*>& scores, const MoeConfig& config,
                             Tensor* bias, QuantileBalancingResult* result,
                             const RankGroup& group = {});

// The same step with the scores left where the model keeps them (f32 [m_i, n] on one device, any;
// the ops of kernels/moe.h and kernels/moe_balancing.h run there): only the routing ids for the
// loads ([m, k] i32, before and after) and the n thresholds reach the host, where `bias` (host f32
// [n]) is updated. Equal to QuantileBalancingStep on the same scores: the thresholds are exact
// order statistics and the selection is SelectTopK's.
// With several ranks the order statistics are the global batch's, taken where the scores are by
// a radix select whose 256-bin histograms are summed over the group (kernels/moe_balancing.h:
// QuantileMargins, MarginKeyHistogram): exact, and only counts cross the group. A rank with no
// scores (empty `scores`) still takes part.
Status QuantileBalancingStepWhereScoresAre(const std::vector<Tensor>& scores,
                                           const MoeConfig& config, Tensor* bias,
                                           QuantileBalancingResult* result,
                                           const RankGroup& group = {});

}  // namespace orrery::model
