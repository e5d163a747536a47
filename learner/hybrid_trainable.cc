#include "learner/hybrid_trainable.h"

#include "learner/cross_entropy.h"

namespace orrery {

model::Batch ToModelBatch(const PackedBatch& batch) {
  model::Batch b;
  b.tokens = Tensor::FromVector<int32_t>({batch.rows, batch.seq_len}, batch.inputs);
  std::vector<int64_t> cu(batch.cu_seqlens.begin(), batch.cu_seqlens.end());
  b.cu_seqlens = Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
  return b;
}

std::vector<ParamRef> HybridTrainable::Parameters() {
  std::vector<ParamRef> out;
  for (model::Parameter& p : model_->parameters()) {
    out.push_back(ParamRef{p.name, p.value, p.grad, p.weight_decay});
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> BalancingBiasBuffers(int64_t first_k_dense,
                                                                 std::vector<Tensor>& biases) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < biases.size(); ++i) {
    out.emplace_back(
        "layers." + std::to_string(first_k_dense + static_cast<int64_t>(i)) + ".moe.balancing_bias",
        biases[i]);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> HybridTrainable::Buffers() {
  return BalancingBiasBuffers(model_->config().first_k_dense, model_->balancing_biases());
}

StatusOr<LossSum> HybridTrainable::ForwardBackward(const PackedBatch& batch, double grad_scale) {
  model::ForwardCache cache;
  ORRERY_ASSIGN_OR_RETURN(Tensor logits, model_->Forward(ToModelBatch(batch), &cache));
  Tensor dlogits;
  ORRERY_ASSIGN_OR_RETURN(LossSum loss, CrossEntropy(logits, batch.targets, grad_scale, &dlogits));
  ORRERY_RETURN_IF_ERROR(model_->Backward(cache, dlogits));
  caches_.push_back(std::move(cache));
  return loss;
}

StatusOr<LossSum> HybridTrainable::Evaluate(const PackedBatch& batch) {
  ORRERY_ASSIGN_OR_RETURN(Tensor logits, model_->Forward(ToModelBatch(batch), nullptr));
  return CrossEntropy(logits, batch.targets, 0, nullptr);
}

StatusOr<std::vector<ExpertLoadReport>> HybridTrainable::UpdateBalancing() {
  std::vector<const model::ForwardCache*> ptrs;
  for (const model::ForwardCache& c : caches_) ptrs.push_back(&c);
  model::BalancingMetrics metrics;
  Status s = model_->UpdateBalancingBiases(ptrs, &metrics);
  caches_.clear();
  ORRERY_RETURN_IF_ERROR(s);
  std::vector<ExpertLoadReport> out;
  for (size_t l = 0; l < metrics.load.size(); ++l) {
    out.push_back(ExpertLoadReport{metrics.load[l], l < metrics.max_violation_before.size()
                                                        ? metrics.max_violation_before[l]
                                                        : 0.0});
  }
  return out;
}

}  // namespace orrery
