// The routed half of the Stable LatentMoE (spec §5.1, §5.2) as Tensor-level ops, dispatched by
// device: the CPU twin (kernels/cpu/moe_experts.cc) follows model::MoeLayer step for step, the
// CUDA path (kernels/cuda/moe_*.cu) is checked against it (tests/gpu/moe_gpu_test.cc).
//
// The GPU model's MoE layer calls, per micro-batch of N tokens:
//   logits = Matmul(x, router^T); scores = sigmoid(logits) (f32)
//   RouteTopK(scores, bias, forced) -> ids, weights
//   MoeExperts(xl, ids, weights, w1, w3, w2) -> y_lat          (then latent RMSNorm, up, shared)
// and backward MoeExpertsGrad -> dxl, dweights, dw1/dw3/dw2; RouteTopKGrad(dweights) -> dlogits.
//
// Devices and dtypes: on cpu every floating tensor is f32 or f64 (one dtype per call: the twin and
// the fp64 finite-difference checks); on cuda the router tensors are f32, the expert activations
// and weights are the compute dtype (bf16 or f32) and every gradient the ops write is f32. ids
// are i32. Expert counts E up to 1024 (kMaxExperts), top_k up to 16 (kMaxTopK).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/expert_exchange.h"
#include "kernels/grouped_gemm.h"
#include "kernels/situ.h"

namespace orrery::kernels {

inline constexpr int64_t kMaxExperts = 1024;
inline constexpr int64_t kMaxTopK = 16;

// Top-k routing (spec §5.1). scores [N, E] (sigmoid outputs; f32, or f64 on cpu); bias f32 [E]
// (selection only; undefined = zeros); forced i32 [N, top_k] or undefined (R3 replay: these ids
// are used instead of the selection). Outputs (allocated when undefined):
//   ids i32 [N, top_k]: the top_k experts by s + b (compared in f64), largest first, ties to the
//       lower expert id -- model::SelectTopK's order exactly;
//   weights [N, top_k] in scores' dtype: rho s_id / (sum_j s_j + 1e-20) over the chosen, with the
//       unbiased scores, summed in slot order in scores' dtype (MoeLayer's formula and order).
// A forced id outside [0, E) or repeated in a row fails with MoeLayer's InvalidArgument message
// for the first such token; on cuda that costs a 4-byte read back (only when forced is given).
Status RouteTopK(const Tensor& scores, const Tensor& bias, const Tensor& forced, int64_t top_k,
                 double routed_scale, Tensor* ids, Tensor* weights);

// The gradient through the weights into the router logits: with S = sum_top s + 1e-20,
//   dlogits[t, e] = (rho / S)(dw_e - sum_j (s_j / S) dw_j) * s_e (1 - s_e)  for e chosen, else 0.
// The sigmoid derivative is included (as MoeLayer::Backward does), so the caller goes straight to
// the router product dx += dlogits W_r, dW_r += dlogits^T x. scores [N, E], dweights [N, k] of
// scores' dtype; ids [N, k] as RouteTopK returned them (distinct per row; on cpu an id outside
// [0, E) is an error, on cuda it is not checked); dlogits [N, E] in scores' dtype, overwritten
// (allocated when undefined).
Status RouteTopKGrad(const Tensor& scores, const Tensor& ids, const Tensor& dweights,
                     double routed_scale, Tensor* dlogits);

// What the experts' backward needs from the forward. M = N * top_k (token, slot) pairs, flat
// index p = token * top_k + slot; "rows" are the pairs sorted by expert (a stable counting sort:
// within an expert, by p), so expert e owns rows [offsets[e], offsets[e + 1]).
struct MoeExpertsSaved {
  Tensor perm;  // i32 [M]: row -> p
  Tensor rank;  // i32 [N, top_k]: p -> row (the inverse of perm)
  // [E + 1] on the host: on cpu, and on cuda when the per-expert loop ran (read back); empty
  // after cuda's grouped path, which keeps them on the device only.
  std::vector<int64_t> offsets;
  Tensor offsets_device;  // i32 [E + 1] on cuda (undefined on cpu)
  Tensor xg;              // [M, L] the gathered inputs xl[p / top_k]
  Tensor a, u;            // [M, F] the GLU pre-activations (w1 and w3 products)
  Tensor o;               // [M, L] the expert outputs before weighting (for dweights)
  // With an exchange (MoeExpertsOptions::exchange): its plan, and then xg, a and u hold the rows
  // this rank's experts received ([plan.owned_offsets.back(), .]) while o stays [M, L].
  ExpertExchangePlan plan;
};

// The routed experts' weighted latent sum (spec §5.2):
//   y[t] = sum_j weights[t, j] * E_{ids[t, j]}(xl[t]),  E_e(x) = w2_e glu(w1_e x, w3_e x),
// each token's terms added in ascending expert order (MoeLayer's order). xl [N, L]; ids i32
// [N, k]; weights [N, k] (xl's dtype on cpu, f32 on cuda); experts stacked: w1, w3 [E, F, L] and
// w2 [E, L, F] in xl's dtype. y [N, L] in xl's dtype, overwritten (allocated when undefined).
// saved may be null (inference). An id outside [0, E) fails with InvalidArgument.
// The rows of one expert are contiguous after the permutation. The products:
//   grouped path (cuda, bf16, F and L multiples of kGroupedGemmDimMultiple, options.grouped_gemm):
//       one kernels/grouped_gemm.h launch per product for all experts, the offsets staying on the
//       device: no read back, no stream synchronisation. The ids are not checked on this path
//       (RouteTopK's are valid by construction): an id outside [0, E) is not reported, its pair
//       lands in no expert's rows and its term reads some expert row (wrong, but no access outside
//       the tensors).
//   loop path (cpu, and cuda otherwise): kernels::Matmul on each expert's row views (cuBLASLt on
//       cuda). This needs the per-expert counts on the host: one device-to-host copy of E + 2
//       ints (and a stream synchronisation) per call, which also checks the ids.
// Expert parallelism (kernels/expert_exchange.h): with an exchange, ids are global expert ids in
// [0, exchange->num_experts()), w1, w3, w2 (and dw1, dw3, dw2) hold this rank's local experts only
// ([exchange->local_experts(), ...]), and the call is collective over the exchange's group. The
// per-expert row counts are then needed on the host (the plan's count exchange): on cuda one read
// back of E + 2 ints per call, as the loop path pays.
struct MoeExpertsOptions {
  bool grouped_gemm = true;            // false: the loop path everywhere (tests compare the two)
  ExpertExchange* exchange = nullptr;  // not owned; null: every expert is local
};
Status MoeExperts(const Tensor& xl, const Tensor& ids, const Tensor& weights, const Tensor& w1,
                  const Tensor& w3, const Tensor& w2, const GluActivation& act, Tensor* y,
                  MoeExpertsSaved* saved, const MoeExpertsOptions& options = {});

// Backward of MoeExperts from its saved state and the upstream dy [N, L] (xl's dtype; on cuda
// also f32). Gradient dtype G: xl's on cpu, f32 on cuda.
//   dxl [N, L] G, accumulated (+=; allocated zeroed when undefined);
//   dweights [N, k] G, overwritten (allocated when undefined): dot(dy[t], E_{ids[t,j]}(xl[t]));
//   dw1, dw3 [E, F, L] and dw2 [E, L, F] G, accumulated (allocated zeroed when undefined).
// The GLU output h is recomputed from the saved a, u. The grouped path as for MoeExperts (the
// offsets from saved.offsets_device, no device-to-host copy); the loop path takes saved.offsets,
// or reads the device's back when the forward ran grouped.
Status MoeExpertsGrad(const Tensor& xl, const Tensor& ids, const Tensor& weights, const Tensor& w1,
                      const Tensor& w3, const Tensor& w2, const GluActivation& act,
                      const MoeExpertsSaved& saved, const Tensor& dy, Tensor* dxl, Tensor* dweights,
                      Tensor* dw1, Tensor* dw3, Tensor* dw2, const MoeExpertsOptions& options = {});

}  // namespace orrery::kernels
