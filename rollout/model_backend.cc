#include "rollout/model_backend.h"

#include <algorithm>
#include <map>
#include <string>

#include "rollout/feed_plan.h"

namespace orrery::rollout {

StatusOr<std::unique_ptr<ModelBackend>> ModelBackend::Create(model::Model* model, int max_slots,
                                                             int64_t max_context,
                                                             int64_t context_tokens) {
  if (max_slots < 1 || max_context < 2 || context_tokens < 0) {
    return InvalidArgumentError(
        "model backend: max_slots must be >= 1, max_context >= 2 and context_tokens >= 0");
  }
  model::InferenceOptions options;
  options.num_slots = max_slots;
  options.max_tokens_per_slot = max_context;
  ORRERY_ASSIGN_OR_RETURN(auto state, model::InferenceState::Create(*model, options));
  for (int s = 0; s < max_slots; ++s) {
    ORRERY_ASSIGN_OR_RETURN(int64_t slot, state->Allocate());
    if (slot != s) return InternalError("model backend: slots are not handed out in order");
  }
  return std::unique_ptr<ModelBackend>(
      new ModelBackend(model, std::move(state), max_slots, max_context, context_tokens));
}

ModelBackend::ModelBackend(model::Model* model, std::unique_ptr<model::InferenceState> state,
                           int max_slots, int64_t max_context, int64_t context_tokens)
    : model_(model),
      state_(std::move(state)),
      max_slots_(max_slots),
      max_context_(max_context),
      context_tokens_(context_tokens) {}

int64_t ModelBackend::vocab_size() const { return model_->config().vocab_size; }
int ModelBackend::moe_layers() const { return static_cast<int>(model_->config().num_moe_layers()); }
int ModelBackend::top_k() const { return static_cast<int>(model_->config().moe.top_k); }

void ModelBackend::Release(int slot) {
  if (slot >= 0 && slot < max_slots_) (void)state_->Reset(slot);
}

Status ModelBackend::CopySlot(int src, int dst) {
  if (context_tokens_ > 0 && CopyCost(src) - state_->length(dst) > free_context()) {
    return ResourceExhaustedError("model backend: copying slot " + std::to_string(src) + " takes " +
                                  std::to_string(CopyCost(src)) + " context tokens, " +
                                  std::to_string(free_context()) + " of " +
                                  std::to_string(context_tokens_) + " are free");
  }
  return state_->CopySlot(src, dst);
}

int64_t ModelBackend::context_capacity() const {
  return context_tokens_ > 0 ? context_tokens_ : kUnlimited;
}

int64_t ModelBackend::free_context() const {
  if (context_tokens_ == 0) return kUnlimited;
  int64_t used = 0;
  for (int s = 0; s < max_slots_; ++s) used += state_->length(s);
  return context_tokens_ - used;
}

int64_t ModelBackend::FeedCost(int /*slot*/, int64_t tokens) const { return tokens; }
int64_t ModelBackend::CopyCost(int src) const { return state_->length(src); }

StatusOr<FeedResult> ModelBackend::Feed(const std::vector<int>& slots,
                                        const std::vector<std::vector<int32_t>>& tokens) {
  ORRERY_ASSIGN_OR_RETURN(FeedPlan plan,
                          FeedPlan::Make(slots, tokens, max_slots_, max_context_, vocab_size(),
                                         [this](int s) { return state_->length(s); }));
  if (context_tokens_ > 0) {
    int64_t fed = 0;
    for (const auto& t : tokens) fed += static_cast<int64_t>(t.size());
    if (fed > free_context()) {
      return ResourceExhaustedError("model backend: the feed takes " + std::to_string(fed) +
                                    " context tokens, " + std::to_string(free_context()) + " of " +
                                    std::to_string(context_tokens_) + " are free");
    }
  }
  model::StepOutput pre, dec;
  if (!plan.prefill_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(pre,
                            model_->Prefill(state_.get(), plan.prefill_slots, plan.prefill_tokens));
  }
  if (!plan.decode_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(
        dec, model_->DecodeStep(state_.get(), plan.decode_slots, plan.decode_tokens));
  }
  return plan.Merge(pre, dec, vocab_size(), moe_layers(), top_k());
}

Status ModelBackend::LoadWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                                 int64_t version) {
  ORRERY_RETURN_IF_ERROR(LoadNamedWeights(*model_, named));
  version_ = version;
  return Status::OK();
}

StatusOr<std::vector<std::pair<std::string, Tensor>>> ModelBackend::WeightTargets() {
  return NamedWeights(*model_);
}

Status ModelBackend::WeightsWritten(int64_t version) {
  version_ = version;  // the decode state reads the parameters themselves: nothing derives
  return Status::OK();
}

std::vector<std::pair<std::string, Tensor>> NamedWeights(model::Model& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (model::Parameter& p : model.parameters()) out.emplace_back(p.name, p.value);
  const auto& c = model.config();
  for (size_t i = 0; i < model.balancing_biases().size(); ++i) {
    out.emplace_back("layers." + std::to_string(c.first_k_dense + static_cast<int64_t>(i)) +
                         ".moe.balancing_bias",
                     model.balancing_biases()[i]);
  }
  return out;
}

Status CopyNamedTensors(const std::vector<std::pair<std::string, Tensor>>& target_list,
                        const std::vector<std::pair<std::string, Tensor>>& named) {
  std::map<std::string, Tensor> targets(target_list.begin(), target_list.end());
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : named) {
    auto it = targets.find(name);
    if (it == targets.end()) {
      return NotFoundError("weights: the model has no tensor '" + name + "'");
    }
    if (t.shape() != it->second.shape()) {
      return InvalidArgumentError("weights: tensor '" + name + "' is " + t.ToString() +
                                  ", the model's is " + it->second.ToString());
    }
    given[name] = &t;
  }
  for (const auto& [name, t] : targets) {
    if (!given.count(name)) return NotFoundError("weights: tensor '" + name + "' is missing");
  }
  for (const auto& [name, src] : given) {
    Tensor& dst = targets[name];
    if (src->dtype() == dst.dtype()) {
      ORRERY_RETURN_IF_ERROR(dst.CopyFrom(*src));
    } else {
      ORRERY_ASSIGN_OR_RETURN(Tensor cast, src->Cast(dst.dtype()));
      ORRERY_RETURN_IF_ERROR(dst.CopyFrom(cast));
    }
  }
  return Status::OK();
}

Status LoadNamedWeights(model::Model& model,
                        const std::vector<std::pair<std::string, Tensor>>& named) {
  return CopyNamedTensors(NamedWeights(model), named);
}

}  // namespace orrery::rollout
