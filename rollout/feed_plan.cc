#include "rollout/feed_plan.h"

#include <algorithm>
#include <string>

namespace orrery::rollout {

StatusOr<FeedPlan> FeedPlan::Make(const std::vector<int>& slots,
                                  const std::vector<std::vector<int32_t>>& tokens, int max_slots,
                                  int64_t max_context, int64_t vocab,
                                  const std::function<int64_t(int)>& length) {
  if (slots.empty() || slots.size() != tokens.size()) {
    return InvalidArgumentError("model backend: feed needs one non-empty token list per slot");
  }
  std::vector<bool> seen(static_cast<size_t>(max_slots), false);
  for (size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    if (s < 0 || s >= max_slots || seen[static_cast<size_t>(s)]) {
      return InvalidArgumentError("model backend: slot " + std::to_string(s) +
                                  " is out of range or listed twice");
    }
    seen[static_cast<size_t>(s)] = true;
    if (tokens[i].empty()) return InvalidArgumentError("model backend: empty feed");
    if (length(s) + static_cast<int64_t>(tokens[i].size()) > max_context) {
      return OutOfRangeError("model backend: slot " + std::to_string(s) + " would exceed " +
                             std::to_string(max_context) + " tokens");
    }
    for (int32_t t : tokens[i]) {
      if (t < 0 || t >= vocab) {
        return OutOfRangeError("model backend: token " + std::to_string(t) +
                               " outside the vocabulary");
      }
    }
  }
  FeedPlan plan;
  int64_t pre_tok = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t n = static_cast<int64_t>(tokens[i].size());
    if (n == 1 && length(slots[i]) > 0) {
      const auto row = static_cast<int64_t>(plan.decode_slots.size());
      plan.sources_.push_back({true, row, row, n});
      plan.decode_slots.push_back(slots[i]);
      plan.decode_tokens.push_back(tokens[i][0]);
    } else {
      plan.sources_.push_back({false, static_cast<int64_t>(plan.prefill_slots.size()), pre_tok, n});
      plan.prefill_slots.push_back(slots[i]);
      plan.prefill_tokens.push_back(tokens[i]);
      pre_tok += n;
    }
  }
  return plan;
}

StatusOr<FeedResult> FeedPlan::Merge(const model::StepOutput& prefill,
                                     const model::StepOutput& decode, int64_t vocab, int moe_layers,
                                     int top_k) const {
  model::StepOutput calls[2] = {prefill, decode};
  for (model::StepOutput& o : calls) {
    if (o.logits.defined() && o.logits.dtype() != DType::kF32) {
      ORRERY_ASSIGN_OR_RETURN(o.logits, o.logits.Cast(DType::kF32));
    }
  }
  int64_t fed = 0;
  for (const Source& s : sources_) fed += s.tokens;
  const int k = top_k;
  FeedResult out;
  out.logits = Tensor::Empty({static_cast<int64_t>(sources_.size()), vocab}, DType::kF32);
  out.expert_ids = Tensor::Empty({moe_layers, fed, k}, DType::kI32);
  int64_t at = 0;
  for (size_t i = 0; i < sources_.size(); ++i) {
    const Source& s = sources_[i];
    const model::StepOutput& src = calls[s.decode ? 1 : 0];
    std::copy_n(src.logits.data<float>() + s.row * vocab, vocab,
                out.logits.data<float>() + static_cast<int64_t>(i) * vocab);
    const int64_t src_tokens = moe_layers > 0 ? src.expert_ids.dim(1) : 0;
    for (int l = 0; l < moe_layers; ++l) {
      std::copy_n(src.expert_ids.data<int32_t>() + (l * src_tokens + s.first_tok) * k, s.tokens * k,
                  out.expert_ids.data<int32_t>() + (l * fed + at) * k);
    }
    at += s.tokens;
  }
  return out;
}

StatusOr<SampledFeed> FeedPlan::MergeSampled(const SampledCall& prefill, const SampledCall& decode,
                                             int moe_layers, int top_k) const {
  const SampledCall* calls[2] = {&prefill, &decode};
  int64_t fed = 0;
  for (const Source& s : sources_) fed += s.tokens;
  const int k = top_k;
  SampledFeed out;
  out.expert_ids = Tensor::Empty({moe_layers, fed, k}, DType::kI32);
  int64_t at = 0;
  for (const Source& s : sources_) {
    const SampledCall& src = *calls[s.decode ? 1 : 0];
    if (s.row >= static_cast<int64_t>(src.ids.size()) ||
        s.row >= static_cast<int64_t>(src.logprobs.size())) {
      return InternalError("feed plan: a call drew fewer tokens than it had slots");
    }
    out.tokens.push_back(
        {src.ids[static_cast<size_t>(s.row)], src.logprobs[static_cast<size_t>(s.row)]});
    const int64_t src_tokens = moe_layers > 0 ? src.expert_ids.dim(1) : 0;
    for (int l = 0; l < moe_layers; ++l) {
      std::copy_n(src.expert_ids.data<int32_t>() + (l * src_tokens + s.first_tok) * k, s.tokens * k,
                  out.expert_ids.data<int32_t>() + (l * fed + at) * k);
    }
    at += s.tokens;
  }
  return out;
}

}  // namespace orrery::rollout
