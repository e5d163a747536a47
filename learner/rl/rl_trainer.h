// RlTrainer: one learner rank of asynchronous agentic RL (spec/rl.md §2, §6).
//
// Each Step takes this rank's share of sampled groups and makes one policy update:
//   1. drops samples outside the staleness window (learner_version - min_t v_t > η) and samples
//      an environment fault ended (PolicySample::env_fault: masked, never trained with reward 0);
//   2. computes group-relative advantages (GRPO / Dr. GRPO / RLOO) from the rewards; groups whose
//      rewards are all equal carry no signal and are skipped (DAPO dynamic sampling);
//   3. splits the samples into `minibatches` minibatches and packs each into micro-batches (one
//      row each, a document per sample); the model's forward runs with the recorded routing
//      forced (R3), logits divided by the rollout's temperature. π_prox is the policy before this
//      update: the first optimizer step's own forward, and for the other minibatches a forward
//      made before any step. So with one step per update (the default) the PPO ratio is 1 at the
//      forward and the behaviour weight π_prox/μ carries the off-policy correction; with more
//      (ppo_epochs x minibatches > 1), later steps see π_θ ≠ π_prox and the clip acts;
//   4. ppo_epochs passes over the minibatches, one optimizer step per minibatch: the policy loss
//      (decoupled PPO with TIS/MIS), token-mean over the minibatch's masked tokens of every rank
//      (the count is all-reduced first), backward, gradients all-reduced over ranks, clipped by
//      global norm, AdamW;
//   5. Quantile Balancing from the last pass's router scores of every rank (the global batch's
//      quantiles through sums over ranks, model/global_order_statistics.h), so every
//      rank routes identically.
// The policy version is the number of updates done (each of ppo_epochs x minibatches optimizer
// steps). Checkpoints hold the weights, the AdamW
// state and the version, so ranks killed mid-run resume exactly from the last one.
//
// The model is the host f32 Model or the GPU model (model/gpu/gpu_model.h: on CUDA, or on the
// ops' CPU twins); the Step above is the same for both, the model side is a PolicyModel
// (learner/rl/policy_model.h). On the GPU model the logits of a micro-batch never exist at once
// (the LM head is fused with the loss), π_prox of the first step comes from the same forward (the
// fused head runs its forward-only pass first), gradients and AdamW stay on the device, and with
// several ranks the gradients are all-reduced through host copies (the Communicator takes host
// spans).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "learner/adamw.h"
#include "learner/comm/communicator.h"
#include "learner/rl/advantage.h"
#include "learner/rl/policy_loss.h"
#include "learner/rl/policy_model.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"

namespace orrery::rl {

// What the learner needs of one trajectory (the replay store's record, decoded).
struct PolicySample {
  std::vector<int32_t> tokens;
  std::vector<float> behaviour_logprobs;  // log μ of token t given tokens before it
  std::vector<int64_t> policy_versions;
  std::vector<uint8_t> loss_mask;        // 1 on model tokens
  std::vector<uint16_t> routed_experts;  // [tokens x moe_layers x top_k] or empty (no R3)
  double reward = 0;
  // Ended by an environment fault (tool error of the environment, timeout, lost env worker): the
  // reward is not the policy's, so the sample is masked out (rollout::Trajectory::env_fault).
  bool env_fault = false;
  int64_t min_policy_version() const;  // over masked tokens
};

struct PolicyGroup {
  uint64_t group_id = 0;
  std::vector<PolicySample> samples;
};

struct RlTrainerOptions {
  PolicyLossOptions loss;
  AdvantageKind advantage = AdvantageKind::kGrpo;
  AdamWOptions adamw;
  double lr = 1e-4;
  double max_grad_norm = 1.0;  // <= 0: no clipping
  double temperature = 1.0;    // the rollouts' sampling temperature (> 0)
  int64_t max_staleness = 4;   // η; < 0: no window
  bool routing_replay = true;  // R3
  bool skip_uniform_groups = true;
  int64_t micro_batch_tokens = 2048;
  int ppo_epochs = 1;   // passes over each sampled batch
  int minibatches = 1;  // optimizer steps per pass (the batch split into this many)
};

Status ValidateRlTrainerOptions(const RlTrainerOptions& options);

struct RlStepStats {
  int64_t version = 0;   // after the update
  PolicyLossStats loss;  // summed over ranks and optimizer steps
  double grad_norm = 0;  // before clipping, mean over the optimizer steps
  int64_t optimizer_steps = 0;
  int64_t groups = 0, samples = 0, stale_dropped = 0, uniform_groups = 0;
  int64_t env_fault_dropped = 0;  // samples an environment fault ended (masked)
  // R3 on: samples without recorded routing, dropped (never trained unforced).
  int64_t unrouted_dropped = 0;
  int64_t tokens = 0;  // positions of the samples trained (this rank; each pass feeds them again)
  // learner version - token version -> model tokens (this rank).
  std::map<int64_t, int64_t> staleness;
  // Per MoE layer: the fraction of recorded experts the learner's own router (with the current
  // biases) would also pick, over fed positions (this rank; 1 when nothing was compared).
  std::vector<double> routing_agreement;
  std::vector<std::vector<double>> expert_load;  // per MoE layer, from Quantile Balancing
  std::vector<double> router_entropy;            // per MoE layer (model::BalancingMetrics)
  bool updated = false;  // false when no rank had a usable token (nothing changed)
};

class RlTrainer {
 public:
  // `model` (f32) and `comm` must outlive the trainer.
  static StatusOr<std::unique_ptr<RlTrainer>> Create(model::Model* model, comm::Communicator* comm,
                                                     RlTrainerOptions options);
  // The GPU model (its masters, gradients and AdamW state where it lives).
  static StatusOr<std::unique_ptr<RlTrainer>> Create(model::GpuModel* model,
                                                     comm::Communicator* comm,
                                                     RlTrainerOptions options);

  // Every rank calls Step once per update (with possibly empty `groups`).
  StatusOr<RlStepStats> Step(const std::vector<PolicyGroup>& groups);

  int64_t version() const { return version_; }
  const RlTrainerOptions& options() const { return options_; }
  AdamW& optimizer() { return *adamw_; }
  // The trained weights and balancing biases into `host` (the same config), e.g. to publish them
  // to the rollouts; nothing to do when the trainer trains `host` itself.
  Status CopyWeightsTo(model::Model* host) { return model_->CopyToHost(host); }

  // RUN/checkpoints/step-<version>: weights, AdamW state, version and `files` (name -> contents:
  // model.toml and tokenizer.json make it loadable by LoadPolicyCheckpoint and `orrery generate`);
  // keeps the newest `keep`.
  StatusOr<std::string> SaveCheckpoint(const std::string& checkpoints_dir, int64_t keep,
                                       const std::map<std::string, std::string>& files = {});
  // Restores the newest checkpoint under `checkpoints_dir`; NotFound when there is none.
  Status RestoreLatest(const std::string& checkpoints_dir);
  // Restores one checkpoint directory (RUN/checkpoints/step-N).
  Status Restore(const std::string& checkpoint_dir);

 private:
  RlTrainer(std::unique_ptr<PolicyModel> model, comm::Communicator* comm, RlTrainerOptions options,
            std::unique_ptr<AdamW> adamw);
  static StatusOr<std::unique_ptr<RlTrainer>> Create(std::unique_ptr<PolicyModel> model,
                                                     comm::Communicator* comm,
                                                     RlTrainerOptions options);

  std::unique_ptr<PolicyModel> model_;
  comm::Communicator* comm_;
  RlTrainerOptions options_;
  std::unique_ptr<AdamW> adamw_;
  int64_t version_ = 0;
};

}  // namespace orrery::rl
