// The GPU model (model/gpu/gpu_model.h) as a TrainableModel: the same contract as HybridTrainable,
// with parameters, gradients and the optimizer state on one CUDA device. Checkpoints carry the
// fp32 master weights under the host model's names (loadable by Model::Load and `orrery generate`)
// and the balancing biases under "layers.L.moe.balancing_bias".
#pragma once

#include <memory>
#include <vector>

#include "learner/trainable_model.h"
#include "model/gpu/gpu_model.h"

namespace orrery {

class GpuTrainable : public TrainableModel {
 public:
  explicit GpuTrainable(model::GpuModel* model) : model_(model) {}

  std::vector<ParamRef> Parameters() override;
  std::vector<std::pair<std::string, Tensor>> Buffers() override;
  int64_t max_seq_len() const override { return model_->config().max_seq_len; }
  StatusOr<LossSum> ForwardBackward(const PackedBatch& batch, double grad_scale) override;
  StatusOr<LossSum> Evaluate(const PackedBatch& batch) override;
  StatusOr<std::vector<ExpertLoadReport>> UpdateBalancing() override;
  // The masters were restored from a checkpoint: the bf16 compute copies follow them.
  Status ParametersLoaded() override { return model_->RefreshComputeCopies(); }

 private:
  model::GpuModel* model_;
};

// The GPU batch of a packed batch.
model::GpuBatch ToGpuBatch(const PackedBatch& batch);

}  // namespace orrery
