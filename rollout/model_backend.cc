#include "rollout/model_backend.h"

#include <algorithm>
#include <map>

namespace orrery::rollout {

StatusOr<std::unique_ptr<ModelBackend>> ModelBackend::Create(model::Model* model, int max_slots,
                                                             int64_t max_context) {
  if (max_slots < 1 || max_context < 2) {
    return InvalidArgumentError("model backend: max_slots must be >= 1 and max_context >= 2");
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
      new ModelBackend(model, std::move(state), max_slots, max_context));
}

ModelBackend::ModelBackend(model::Model* model, std::unique_ptr<model::InferenceState> state,
                           int max_slots, int64_t max_context)
    : model_(model), state_(std::move(state)), max_slots_(max_slots), max_context_(max_context) {}

int64_t ModelBackend::vocab_size() const { return model_->config().vocab_size; }
int ModelBackend::moe_layers() const { return static_cast<int>(model_->config().num_moe_layers()); }
int ModelBackend::top_k() const { return static_cast<int>(model_->config().moe.top_k); }

void ModelBackend::Release(int slot) {
  if (slot >= 0 && slot < max_slots_) (void)state_->Reset(slot);
}

StatusOr<FeedResult> ModelBackend::Feed(const std::vector<int>& slots,
                                        const std::vector<std::vector<int32_t>>& tokens) {
  if (slots.empty() || slots.size() != tokens.size()) {
    return InvalidArgumentError("model backend: feed needs one non-empty token list per slot");
  }
  std::vector<bool> seen(max_slots_, false);
  for (size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    if (s < 0 || s >= max_slots_ || seen[s]) {
      return InvalidArgumentError("model backend: slot " + std::to_string(s) +
                                  " is out of range or listed twice");
    }
    seen[s] = true;
    if (tokens[i].empty()) return InvalidArgumentError("model backend: empty feed");
    if (state_->length(s) + static_cast<int64_t>(tokens[i].size()) > max_context_) {
      return OutOfRangeError("model backend: slot " + std::to_string(s) + " would exceed " +
                             std::to_string(max_context_) + " tokens");
    }
    for (int32_t t : tokens[i]) {
      if (t < 0 || t >= vocab_size()) {
        return OutOfRangeError("model backend: token " + std::to_string(t) +
                               " outside the vocabulary");
      }
    }
  }
  // Single tokens after a prefix decode; everything else prefills.
  std::vector<int64_t> pre_slots, dec_slots;
  std::vector<std::vector<int32_t>> pre_tokens;
  std::vector<int32_t> dec_tokens;
  struct Source {
    bool decode;
    int64_t row;        // row in that call's logits
    int64_t first_tok;  // first token in that call's expert ids
  };
  std::vector<Source> sources;
  int64_t pre_tok = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (tokens[i].size() == 1 && state_->length(slots[i]) > 0) {
      sources.push_back(
          {true, static_cast<int64_t>(dec_slots.size()), static_cast<int64_t>(dec_slots.size())});
      dec_slots.push_back(slots[i]);
      dec_tokens.push_back(tokens[i][0]);
    } else {
      sources.push_back({false, static_cast<int64_t>(pre_slots.size()), pre_tok});
      pre_slots.push_back(slots[i]);
      pre_tokens.push_back(tokens[i]);
      pre_tok += static_cast<int64_t>(tokens[i].size());
    }
  }
  model::StepOutput pre, dec;
  if (!pre_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(pre, model_->Prefill(state_.get(), pre_slots, pre_tokens));
  }
  if (!dec_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(dec, model_->DecodeStep(state_.get(), dec_slots, dec_tokens));
  }
  for (model::StepOutput* o : {&pre, &dec}) {
    if (o->logits.defined() && o->logits.dtype() != DType::kF32) {
      ORRERY_ASSIGN_OR_RETURN(o->logits, o->logits.Cast(DType::kF32));
    }
  }
  const int64_t v = vocab_size();
  const int layers = moe_layers(), k = top_k();
  int64_t fed = 0;
  for (const auto& t : tokens) fed += static_cast<int64_t>(t.size());
  FeedResult out;
  out.logits = Tensor::Empty({static_cast<int64_t>(slots.size()), v}, DType::kF32);
  out.expert_ids = Tensor::Empty({layers, fed, k}, DType::kI32);
  int64_t at = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const model::StepOutput& src = sources[i].decode ? dec : pre;
    std::copy_n(src.logits.data<float>() + sources[i].row * v, v, out.logits.data<float>() + i * v);
    const int64_t n = static_cast<int64_t>(tokens[i].size());
    const int64_t src_tokens = layers > 0 ? src.expert_ids.dim(1) : 0;
    for (int l = 0; l < layers; ++l) {
      std::copy_n(src.expert_ids.data<int32_t>() + (l * src_tokens + sources[i].first_tok) * k,
                  n * k, out.expert_ids.data<int32_t>() + (l * fed + at) * k);
    }
    at += n;
  }
  return out;
}

Status ModelBackend::LoadWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                                 int64_t version) {
  ORRERY_RETURN_IF_ERROR(LoadNamedWeights(*model_, named));
  version_ = version;
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

Status LoadNamedWeights(model::Model& model,
                        const std::vector<std::pair<std::string, Tensor>>& named) {
  std::map<std::string, Tensor> targets;
  for (auto& [name, t] : NamedWeights(model)) targets.emplace(name, t);
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : named) {
    auto it = targets.find(name);
    if (it == targets.end())
      return NotFoundError("weights: the model has no tensor '" + name + "'");
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

}  // namespace orrery::rollout
