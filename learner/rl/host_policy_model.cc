// The host f32 Model as a PolicyModel: the [N, V] logits, PolicyLoss over them, the model's own
// backward; the caches of the passes kept for balancing feed UpdateBalancingBiases.
#include "learner/rl/policy_model.h"

namespace orrery::rl {
namespace {

void ScaleLogits(Tensor& t, double factor) {
  float* z = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) z[i] = static_cast<float>(z[i] * factor);
}

class HostPolicy : public PolicyModel {
 public:
  explicit HostPolicy(model::Model* model) : model_(model) {}

  const model::ModelConfig& config() const override { return model_->config(); }

  std::vector<ParamRef> Parameters() override {
    std::vector<ParamRef> out;
    for (model::Parameter& p : model_->parameters()) {
      out.push_back({p.name, p.value, p.grad, p.weight_decay});
    }
    return out;
  }

  std::vector<Tensor>& balancing_biases() override { return model_->balancing_biases(); }

  Status ZeroGrad() override {
    model_->ZeroGrad();
    return Status::OK();
  }

  StatusOr<std::vector<float>> Logprobs(const PolicyBatch& batch, const PolicyLossInput& in,
                                        const PolicyPassOptions& o) override {
    ORRERY_ASSIGN_OR_RETURN(Tensor logits, model_->Forward(ModelBatch(batch), nullptr));
    ScaleLogits(logits, 1.0 / o.temperature);
    return TokenLogprobs(logits, in.targets);
  }

  StatusOr<PolicyLossStats> LossBackward(const PolicyBatch& batch, PolicyLossInput* in,
                                         const PolicyLossOptions& loss,
                                         const PolicyPassOptions& o) override {
    model::ForwardCache cache;
    ORRERY_ASSIGN_OR_RETURN(Tensor logits, model_->Forward(ModelBatch(batch), &cache));
    const double inv_t = 1.0 / o.temperature;
    ScaleLogits(logits, inv_t);
    if (in->proximal_logprobs.empty()) {  // this forward is π_prox
      ORRERY_ASSIGN_OR_RETURN(in->proximal_logprobs, TokenLogprobs(logits, in->targets));
    }
    Tensor dlogits;
    ORRERY_ASSIGN_OR_RETURN(PolicyLossStats s,
                            PolicyLoss(loss, logits, *in, o.grad_scale, &dlogits));
    ScaleLogits(dlogits, inv_t);
    ORRERY_RETURN_IF_ERROR(model_->Backward(cache, dlogits));
    if (o.router_scores != nullptr) *o.router_scores = cache.router_scores();
    if (o.keep_for_balancing) kept_.push_back(std::move(cache));
    return s;
  }

  Status UpdateBalancing(model::BalancingMetrics* metrics, const model::RankGroup& group) override {
    std::vector<const model::ForwardCache*> caches;
    for (const model::ForwardCache& c : kept_) caches.push_back(&c);
    const Status s = model_->UpdateBalancingBiases(caches, metrics, group);
    kept_.clear();
    return s;
  }

  Status ParametersLoaded() override { return Status::OK(); }

  Status CopyToHost(model::Model* host) override {
    if (host == model_) return Status::OK();
    if (host->parameters().size() != model_->parameters().size()) {
      return InvalidArgumentError("rl: CopyToHost into a model of another config");
    }
    for (size_t i = 0; i < host->parameters().size(); ++i) {
      ORRERY_RETURN_IF_ERROR(host->parameters()[i].value.CopyFrom(model_->parameters()[i].value));
    }
    for (size_t l = 0; l < host->balancing_biases().size(); ++l) {
      ORRERY_RETURN_IF_ERROR(host->balancing_biases()[l].CopyFrom(model_->balancing_biases()[l]));
    }
    return Status::OK();
  }

 private:
  static model::Batch ModelBatch(const PolicyBatch& b) {
    model::Batch out;
    out.tokens = Tensor::FromVector<int32_t>({1, static_cast<int64_t>(b.tokens.size())}, b.tokens);
    out.cu_seqlens =
        Tensor::FromVector<int64_t>({static_cast<int64_t>(b.cu_seqlens.size())}, b.cu_seqlens);
    if (b.forced_experts.defined()) out.forced_experts = b.forced_experts;
    return out;
  }

  model::Model* model_;
  std::vector<model::ForwardCache> kept_;  // the passes kept for the next UpdateBalancing
};

}  // namespace

StatusOr<std::unique_ptr<PolicyModel>> HostPolicyModel(model::Model* model) {
  if (model->dtype() != DType::kF32) return InvalidArgumentError("rl: the model must be f32");
  return std::unique_ptr<PolicyModel>(new HostPolicy(model));
}

}  // namespace orrery::rl
