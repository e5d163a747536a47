// ExpertExchange: the boundary of expert parallelism in the MoE experts' ops (kernels/moe.h).
//
// With expert parallelism the E routed experts are sharded over the ranks of a group: rank r holds
// the weights of a contiguous range of experts, [first_expert(), first_expert() + local_experts()),
// and computes them for the tokens of every rank. MoeExperts runs, per rank:
//
//   permute + gather (local)   rows of this rank's (token, slot) pairs sorted by global expert
//   Plan                       how many rows go to each owner (a count exchange: the only
//                              host-visible sizes of the step)
//   ToOwners    (dispatch)     the rows to the ranks owning their experts: this rank receives the
//                              rows of its experts from every rank, grouped by local expert
//   expert products (local)    the grouped GEMMs over the received rows and the local weights
//   FromOwners  (combine)      each computed row back to the rank and the position it came from
//   weighted combine (local)   back to token order
//
// and the backward uses the same two moves with the forward's plan: the output gradient rows
// ToOwners, the input gradient rows FromOwners. An implementation is an all-to-all over a
// communicator (NCCL's ncclSend/ncclRecv pairs, or Gloo's alltoallv on the CPU); the ops need
// nothing else from it. Without an exchange (the default) every expert is local and the moves are
// skipped, which is the single-GPU path.
//
// Owned rows are ordered by local expert, then by source rank, then by the source's row order, so
// the result is the same whatever order the messages arrive in.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

struct ExpertExchangePlan {
  std::vector<int64_t> offsets;        // [E + 1]: this rank's rows, by global expert (as given)
  std::vector<int64_t> owned_offsets;  // [local experts + 1]: the rows this rank's experts receive
  // received[r * local_experts + j]: rows from rank r for local expert j (the owned rows of local
  // expert j are rank 0's, then rank 1's, ...). An implementation may keep more of its own below.
  std::vector<int64_t> received;
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;

  virtual int64_t num_experts() const = 0;  // E over the group
  virtual int64_t first_expert() const = 0;
  virtual int64_t local_experts() const = 0;

  // The plan for this rank's rows by global expert (offsets [E + 1], non-decreasing from 0).
  // Collective: every rank of the group calls it for its own rows.
  virtual StatusOr<ExpertExchangePlan> Plan(const std::vector<int64_t>& offsets) = 0;
  // rows [offsets[E], W] -> owned [owned_offsets.back(), W] (dispatch). Collective.
  virtual Status ToOwners(const Tensor& rows, const ExpertExchangePlan& plan, Tensor* owned) = 0;
  // owned [owned_offsets.back(), W] -> rows [offsets[E], W] (combine), the inverse move of
  // ToOwners with the same plan. Collective.
  virtual Status FromOwners(const Tensor& owned, const ExpertExchangePlan& plan, Tensor* rows) = 0;
};

}  // namespace orrery::kernels
