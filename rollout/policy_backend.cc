// PolicyBackend's default FeedAndSample (rollout/policy_backend.h): Feed, then SampleToken's rule
// on the host.
#include "rollout/policy_backend.h"

#include <string>

namespace orrery::rollout {

StatusOr<SampledFeed> PolicyBackend::FeedAndSample(const std::vector<int>& slots,
                                                   const std::vector<std::vector<int32_t>>& tokens,
                                                   const std::vector<SlotDraw>& draws) {
  if (draws.size() != slots.size()) {
    return InvalidArgumentError("feed and sample: " + std::to_string(slots.size()) + " slots but " +
                                std::to_string(draws.size()) + " draws");
  }
  ORRERY_ASSIGN_OR_RETURN(FeedResult fed, Feed(slots, tokens));
  SampledFeed out;
  out.expert_ids = fed.expert_ids;
  const int64_t v = fed.logits.dim(1);
  for (size_t i = 0; i < slots.size(); ++i) {
    out.tokens.push_back(SampleTokenWithUniform(fed.logits.data<float>() + i * v, v,
                                                draws[i].options, draws[i].uniform));
  }
  return out;
}

}  // namespace orrery::rollout
