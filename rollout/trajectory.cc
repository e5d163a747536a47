#include "rollout/trajectory.h"

#include <algorithm>
#include <limits>

namespace orrery::rollout {

const char* EpisodeStatusName(EpisodeStatus status) {
  switch (status) {
    case EpisodeStatus::kFinished:
      return "finished";
    case EpisodeStatus::kTruncated:
      return "truncated";
    case EpisodeStatus::kToolError:
      return "tool_error";
    case EpisodeStatus::kTimeout:
      return "sandbox_timeout";
    case EpisodeStatus::kEnvLost:
      return "env_lost";
  }
  return "unknown";
}

int64_t Trajectory::model_tokens() const {
  return std::count(loss_mask.begin(), loss_mask.end(), uint8_t{1});
}

int64_t Trajectory::min_policy_version() const {
  int64_t v = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (roles[i] == TokenRole::kModel) v = std::min(v, policy_versions[i]);
  }
  return v == std::numeric_limits<int64_t>::max() ? 0 : v;
}

}  // namespace orrery::rollout
