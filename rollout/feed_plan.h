// FeedPlan: how one PolicyBackend::Feed becomes the model's inference calls, shared by the CPU and
// GPU backends: single tokens appended to a non-empty slot go into one batched DecodeStep, every
// other feed into one Prefill; the two outputs are merged back into the feed's order.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "rollout/policy_backend.h"

namespace orrery::rollout {

struct FeedPlan {
  std::vector<int64_t> prefill_slots, decode_slots;
  std::vector<std::vector<int32_t>> prefill_tokens;
  std::vector<int32_t> decode_tokens;

  // Checks the feed (one non-empty list per distinct slot in [0, max_slots), tokens in the
  // vocabulary, contexts within max_context; `length` gives a slot's current tokens) and splits it.
  static StatusOr<FeedPlan> Make(const std::vector<int>& slots,
                                 const std::vector<std::vector<int32_t>>& tokens, int max_slots,
                                 int64_t max_context, int64_t vocab,
                                 const std::function<int64_t(int)>& length);

  // The feed's result from the calls' outputs (either may be empty when no slot went there):
  // logits f32 [slots, vocab] and expert ids [moe_layers, tokens fed, top_k] in feed order.
  StatusOr<FeedResult> Merge(const model::StepOutput& prefill, const model::StepOutput& decode,
                             int64_t vocab, int moe_layers, int top_k) const;

  // The same for calls that drew each slot's token (ids and log-probabilities per call row, the
  // calls' expert ids as StepOutput's): the drawn tokens and expert ids in feed order.
  struct SampledCall {
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
    Tensor expert_ids;
  };
  StatusOr<SampledFeed> MergeSampled(const SampledCall& prefill, const SampledCall& decode,
                                     int moe_layers, int top_k) const;

 private:
  struct Source {
    bool decode;
    int64_t row;        // row in that call's logits
    int64_t first_tok;  // first token in that call's expert ids
    int64_t tokens;     // tokens fed
  };
  std::vector<Source> sources_;
};

}  // namespace orrery::rollout
