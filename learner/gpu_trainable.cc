#include "learner/gpu_trainable.h"

#include "learner/hybrid_trainable.h"

namespace orrery {

model::GpuBatch ToGpuBatch(const PackedBatch& batch) {
  model::GpuBatch b;
  b.tokens = batch.inputs;
  b.targets = batch.targets;
  b.cu_seqlens.assign(batch.cu_seqlens.begin(), batch.cu_seqlens.end());
  return b;
}

std::vector<ParamRef> GpuTrainable::Parameters() {
  std::vector<ParamRef> out;
  for (model::GpuParameter& p : model_->parameters()) {
    out.push_back(ParamRef{p.name, p.master, p.grad, p.weight_decay, p.compute});
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> GpuTrainable::Buffers() {
  return BalancingBiasBuffers(model_->config().first_k_dense, model_->balancing_biases());
}

StatusOr<LossSum> GpuTrainable::ForwardBackward(const PackedBatch& batch, double grad_scale) {
  ORRERY_ASSIGN_OR_RETURN(model::GpuLoss l,
                          model_->ForwardBackward(ToGpuBatch(batch), grad_scale, true));
  return LossSum{l.loss_sum, l.tokens};
}

StatusOr<LossSum> GpuTrainable::Evaluate(const PackedBatch& batch) {
  ORRERY_ASSIGN_OR_RETURN(model::GpuLoss l, model_->ForwardBackward(ToGpuBatch(batch), 0, false));
  return LossSum{l.loss_sum, l.tokens};
}

StatusOr<std::vector<ExpertLoadReport>> GpuTrainable::UpdateBalancing() {
  model::BalancingMetrics metrics;
  ORRERY_RETURN_IF_ERROR(model_->UpdateBalancing(&metrics));
  std::vector<ExpertLoadReport> out;
  for (size_t l = 0; l < metrics.load.size(); ++l) {
    out.push_back(ExpertLoadReport{metrics.load[l], metrics.max_violation_before[l]});
  }
  return out;
}

}  // namespace orrery
