// The hybrid model (model/model.h) as a TrainableModel: packed batches become model Batches with
// cu_seqlens, the loss is token cross-entropy, and the forward caches of every micro-batch of a
// step are kept for that step's Quantile-Balancing update.
#pragma once

#include <vector>

#include "learner/trainable_model.h"
#include "model/model.h"

namespace orrery {

class HybridTrainable : public TrainableModel {
 public:
  explicit HybridTrainable(model::Model* model) : model_(model) {}

  std::vector<ParamRef> Parameters() override;
  // The balancing biases under the names Model::Save uses ("layers.L.moe.balancing_bias"), so a
  // checkpoint's model.safetensors loads with Model::Load.
  std::vector<std::pair<std::string, Tensor>> Buffers() override;
  // The model config's max_seq_len (NoPE: a declared limit, not a positional one).
  int64_t max_seq_len() const override { return model_->config().max_seq_len; }
  StatusOr<LossSum> ForwardBackward(const PackedBatch& batch, double grad_scale) override;
  StatusOr<LossSum> Evaluate(const PackedBatch& batch) override;
  StatusOr<std::vector<ExpertLoadReport>> UpdateBalancing() override;

 private:
  model::Model* model_;
  std::vector<model::ForwardCache> caches_;  // this step's micro-batches
};

// The model Batch of a packed batch (tokens [rows, seq_len], cu_seqlens i64).
model::Batch ToModelBatch(const PackedBatch& batch);

// The balancing biases (one per MoE layer, layers first_k_dense..) under the names Model::Save
// uses, "layers.L.moe.balancing_bias": the Buffers() of the hybrid model on either device.
std::vector<std::pair<std::string, Tensor>> BalancingBiasBuffers(int64_t first_k_dense,
                                                                 std::vector<Tensor>& biases);

}  // namespace orrery
