// PolicyModel: what RlTrainer (learner/rl/rl_trainer.h) needs of the policy it trains, so one
// Step serves the host Model and the GPU model (model/gpu/gpu_model.h). A pass runs one packed
// micro-batch under forced routing (R3) with the logits divided by the rollouts' temperature:
//   - Logprobs: forward only, log π of the masked rows (π_prox for later minibatches);
//   - LossBackward: the policy loss of learner/rl/policy_loss.h and its gradient. When the
//     input's proximal_logprobs is empty, π_prox is this forward's own policy: it is filled in
//     first (the first optimizer step of an update).
// The host side forms the [N, V] logits and calls PolicyLoss; the GPU side never forms them: its
// LM head is fused with the loss (kernels/lm_head_policy_loss.h), and when π_prox is this
// forward's it runs the head twice over the same hidden states — log-probabilities first, then
// the behaviour weights on the host, then the loss — so the model's forward is made once.
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "learner/param_ref.h"
#include "learner/rl/policy_loss.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"

namespace orrery::rl {

// One micro-batch: samples as documents of one row.
struct PolicyBatch {
  std::vector<int32_t> tokens;
  std::vector<int64_t> cu_seqlens;  // 0 .. n
  Tensor forced_experts;            // i32 [moe layers, n, k] on the host, or undefined
};

struct PolicyPassOptions {
  double temperature = 1.0;
  double grad_scale = 1.0;         // LossBackward: d loss_sum scaled by it
  bool keep_for_balancing = true;  // LossBackward: this pass joins the next UpdateBalancing
  // Non-null: each MoE layer's router scores f32 [n, E] of this pass on the host.
  std::vector<Tensor>* router_scores = nullptr;
};

class PolicyModel {
 public:
  virtual ~PolicyModel() = default;

  virtual const model::ModelConfig& config() const = 0;
  // f32 masters and gradients (host or one CUDA device), in the host model's names and order.
  virtual std::vector<ParamRef> Parameters() = 0;
  // f32 [E] per MoE layer on the host.
  virtual std::vector<Tensor>& balancing_biases() = 0;
  virtual Status ZeroGrad() = 0;

  // log π(targets) of the masked rows (0 elsewhere); no gradient, nothing kept.
  virtual StatusOr<std::vector<float>> Logprobs(const PolicyBatch& batch, const PolicyLossInput& in,
                                                const PolicyPassOptions& options) = 0;
  // Adds grad_scale * d loss_sum / d θ to the gradients; the statistics are unscaled.
  virtual StatusOr<PolicyLossStats> LossBackward(const PolicyBatch& batch, PolicyLossInput* in,
                                                 const PolicyLossOptions& loss,
                                                 const PolicyPassOptions& options) = 0;
  // Quantile Balancing from the passes kept since the last call, over the group's global batch.
  virtual Status UpdateBalancing(model::BalancingMetrics* metrics,
                                 const model::RankGroup& group) = 0;
  // The masters were written directly (a checkpoint restore): derived copies follow them.
  virtual Status ParametersLoaded() = 0;
  // Copies the weights and balancing biases into `host` (same config), e.g. to publish them;
  // nothing when `host` is the trained model itself.
  virtual Status CopyToHost(model::Model* host) = 0;
};

// The host f32 model, trained in place (`model` must outlive the result).
StatusOr<std::unique_ptr<PolicyModel>> HostPolicyModel(model::Model* model);
// The GPU model (on CUDA, or on the CPU twins with f32), `model` must outlive the result.
StatusOr<std::unique_ptr<PolicyModel>> GpuPolicyModel(model::GpuModel* model);

}  // namespace orrery::rl
