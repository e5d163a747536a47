// The GPU model as a PolicyModel: its forward and backward with the LM head fused with the policy
// loss (kernels/lm_head_policy_loss.h) as the loss head. The behaviour weights depend on π_prox
// and μ only, so they are computed on the host (BehaviourWeights) and uploaded with the other
// per-token columns; when π_prox is this forward's own, the head first runs the forward-only pass
// over the same hidden states and brings log π back for them.
#include <vector>

#include "kernels/lm_head_policy_loss.h"
#include "learner/rl/policy_model.h"

namespace orrery::rl {
namespace {

StatusOr<Tensor> Upload(const std::vector<float>& v, Device device) {
  return Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v).To(device);
}

// loss == null: the forward-only pass (log π into `logprobs`); else the loss and its gradient.
class PolicyHead : public model::GpuLossHead {
 public:
  PolicyHead(PolicyLossInput* in, const PolicyLossOptions* loss, const PolicyPassOptions& o)
      : in_(in), loss_(loss), options_(o) {}

  Status Run(const Tensor& hn, const Tensor& head, bool backward, Tensor* dhn,
             Tensor* head_grad) override {
    const Device dev = hn.device();
    const size_t n = in_->targets.size();
    std::vector<int32_t> targets(in_->targets);
    std::vector<float> mask(n);
    for (size_t i = 0; i < n; ++i) {
      mask[i] = in_->mask[i] != 0 ? 1.0f : 0.0f;
      if (targets[i] < 0) targets[i] = 0;  // never read: only masked rows are
    }
    kernels::PolicyRows rows;
    ORRERY_ASSIGN_OR_RETURN(
        rows.targets, Tensor::FromVector<int32_t>({static_cast<int64_t>(n)}, targets).To(dev));
    ORRERY_ASSIGN_OR_RETURN(rows.mask, Upload(mask, dev));
    kernels::LmHeadPolicyOptions o;
    o.temperature = options_.temperature;
    o.grad_scale = options_.grad_scale;
    if (loss_ == nullptr || in_->proximal_logprobs.empty()) {
      Tensor logp;
      ORRERY_RETURN_IF_ERROR(
          kernels::LmHeadTokenLogprobs(hn, head, rows.targets, rows.mask, o, &logp, nullptr));
      ORRERY_ASSIGN_OR_RETURN(Tensor host, logp.To(Device::Cpu()));
      logprobs.assign(host.data<float>(), host.data<float>() + n);
      if (loss_ == nullptr) return Status::OK();
      in_->proximal_logprobs = logprobs;  // this forward is π_prox
    }
    ORRERY_ASSIGN_OR_RETURN(const std::vector<double> w, BehaviourWeights(*loss_, *in_, &stats));
    const std::vector<float> weight(w.begin(), w.end());
    ORRERY_ASSIGN_OR_RETURN(rows.proximal, Upload(in_->proximal_logprobs, dev));
    ORRERY_ASSIGN_OR_RETURN(rows.weight, Upload(weight, dev));
    ORRERY_ASSIGN_OR_RETURN(rows.advantage, Upload(in_->advantages, dev));
    if (loss_->kl_coef > 0) {
      ORRERY_ASSIGN_OR_RETURN(rows.ref, Upload(in_->ref_logprobs, dev));
    }
    o.clip_low = loss_->clip_low;
    o.clip_high = loss_->clip_high;
    o.entropy_coef = loss_->entropy_coef;
    o.kl_coef = loss_->kl_coef;
    kernels::PolicyRowSums s;
    ORRERY_RETURN_IF_ERROR(kernels::LmHeadPolicyLoss(
        hn, head, rows, o, &s, nullptr, backward ? dhn : nullptr, backward ? head_grad : nullptr));
    stats.loss_sum = s.loss_sum;
    stats.tokens = s.tokens;
    stats.clipped = s.clipped;
    stats.entropy_sum = s.entropy_sum;
    stats.ratio_sum = s.ratio_sum;
    stats.approx_kl_sum = s.approx_kl_sum;
    stats.ref_kl_sum = s.ref_kl_sum;
    return Status::OK();
  }

  std::vector<float> logprobs;
  PolicyLossStats stats;  // the behaviour-weight sums from the host, the rest from the op

 private:
  PolicyLossInput* in_;
  const PolicyLossOptions* loss_;
  PolicyPassOptions options_;
};

class GpuPolicy : public PolicyModel {
 public:
  explicit GpuPolicy(model::GpuModel* model) : model_(model) {}

  const model::ModelConfig& config() const override { return model_->config(); }

  std::vector<ParamRef> Parameters() override {
    std::vector<ParamRef> out;
    for (model::GpuParameter& p : model_->parameters()) {
      out.push_back(ParamRef{p.name, p.master, p.grad, p.weight_decay, p.compute});
    }
    return out;
  }

  std::vector<Tensor>& balancing_biases() override { return model_->balancing_biases(); }
  Status ZeroGrad() override { return model_->ZeroGrad(); }

  StatusOr<std::vector<float>> Logprobs(const PolicyBatch& batch, const PolicyLossInput& in,
                                        const PolicyPassOptions& o) override {
    PolicyLossInput copy = in;
    PolicyHead head(&copy, nullptr, o);
    model::GpuPassOptions pass;
    pass.router_scores = o.router_scores;
    ORRERY_RETURN_IF_ERROR(model_->ForwardBackwardWith(ToGpuBatch(batch, in), &head, pass));
    return std::move(head.logprobs);
  }

  StatusOr<PolicyLossStats> LossBackward(const PolicyBatch& batch, PolicyLossInput* in,
                                         const PolicyLossOptions& loss,
                                         const PolicyPassOptions& o) override {
    PolicyHead head(in, &loss, o);
    model::GpuPassOptions pass;
    pass.backward = true;
    pass.keep_for_balancing = o.keep_for_balancing;
    pass.router_scores = o.router_scores;
    ORRERY_RETURN_IF_ERROR(model_->ForwardBackwardWith(ToGpuBatch(batch, *in), &head, pass));
    return head.stats;
  }

  Status UpdateBalancing(model::BalancingMetrics* metrics, const model::RankGroup& group) override {
    return model_->UpdateBalancing(metrics, group);
  }
  Status ParametersLoaded() override { return model_->RefreshComputeCopies(); }
  Status CopyToHost(model::Model* host) override { return model_->CopyToHost(host); }

 private:
  static model::GpuBatch ToGpuBatch(const PolicyBatch& b, const PolicyLossInput& in) {
    model::GpuBatch out;
    out.tokens = b.tokens;
    out.targets = in.targets;
    out.cu_seqlens = b.cu_seqlens;
    out.forced_experts = b.forced_experts;
    return out;
  }

  model::GpuModel* model_;
};

}  // namespace

StatusOr<std::unique_ptr<PolicyModel>> GpuPolicyModel(model::GpuModel* model) {
  return std::unique_ptr<PolicyModel>(new GpuPolicy(model));
}

}  // namespace orrery::rl
