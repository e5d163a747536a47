// ModelBackend: a PolicyBackend over model::Model and its decode state (model/inference_state.h:
// KDA recurrent + conv state, MLA latent cache per slot). Multi-token feeds (prompts, tool
// results) go through one Model::Prefill call, single tokens through one Model::DecodeStep call;
// both equal the full forward of each slot's sequence, so the recorded logprobs and routing are
// the learner's for the same weights.
//
// LoadWeights keeps every slot's state: the context computed under the old weights stays, and
// decoding continues under the new ones (partial rollouts, as in Kimi k1.5 and AReaL).
//
// CopySlot copies the state (InferenceState::CopySlot). The context pool is unlimited unless
// `context_tokens` > 0 is given: then the slots hold at most that many tokens together, a feed or
// copy beyond it is a ResourceExhausted error before any change, and FeedCost / CopyCost are the
// tokens added (a host-side stand-in for the GPU's page pool, for tests of admission control).
#pragma once

#include <memory>
#include <vector>

#include "model/inference_state.h"
#include "model/model.h"
#include "rollout/policy_backend.h"

namespace orrery::rollout {

class ModelBackend : public PolicyBackend {
 public:
  // `model` must outlive the backend; it is used in place (LoadWeights writes into it).
  static StatusOr<std::unique_ptr<ModelBackend>> Create(model::Model* model, int max_slots,
                                                        int64_t max_context,
                                                        int64_t context_tokens = 0);

  int64_t vocab_size() const override;
  int moe_layers() const override;
  int top_k() const override;
  int max_slots() const override { return max_slots_; }
  int64_t max_context() const override { return max_context_; }
  StatusOr<FeedResult> Feed(const std::vector<int>& slots,
                            const std::vector<std::vector<int32_t>>& tokens) override;
  void Release(int slot) override;
  Status CopySlot(int src, int dst) override;
  int64_t context_capacity() const override;
  int64_t free_context() const override;
  int64_t FeedCost(int slot, int64_t tokens) const override;
  int64_t CopyCost(int src) const override;
  Status LoadWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                     int64_t version) override;
  int64_t version() const override { return version_; }
  StatusOr<std::vector<std::pair<std::string, Tensor>>> WeightTargets() override;
  Status WeightsWritten(int64_t version) override;

 private:
  ModelBackend(model::Model* model, std::unique_ptr<model::InferenceState> state, int max_slots,
               int64_t max_context, int64_t context_tokens);

  model::Model* model_;
  std::unique_ptr<model::InferenceState> state_;
  int max_slots_;
  int64_t max_context_;
  int64_t context_tokens_;  // 0: unlimited
  int64_t version_ = 0;
};

// Copies each named tensor into the target of the same name (cast to the target's dtype, on the
// target's device). Every name must be a target's, with its shape, and every target must be given;
// nothing is written when a check fails. The weight load of both backends.
Status CopyNamedTensors(const std::vector<std::pair<std::string, Tensor>>& targets,
                        const std::vector<std::pair<std::string, Tensor>>& named);
// Copies named tensors into the model's parameters and balancing biases
// ("layers.L.moe.balancing_bias"), as CopyNamedTensors. Shared by backends and the learner's
// publication tests.
Status LoadNamedWeights(model::Model& model,
                        const std::vector<std::pair<std::string, Tensor>>& named);
// The model's parameters and balancing biases under those names (views, not copies).
std::vector<std::pair<std::string, Tensor>> NamedWeights(model::Model& model);

}  // namespace orrery::rollout
