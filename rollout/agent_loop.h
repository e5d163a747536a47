// AgentLoop: multi-turn tool-using episodes on a continuous-batching generation engine.
//
// Groups of G episodes of one task are queued with AddGroup. Each Step():
//   1. starts queued episodes in free slots (env Reset, prompt = the chat format's rendering of
//      the initial messages with an open assistant turn);
//   2. feeds every active episode its pending tokens (a prompt, tool results, or the token sampled
//      last step) to the backend in one call, recording the routed experts of each fed token;
//   3. samples one token per episode (temperature / top-p), recording its behaviour log-prob and
//      the policy version;
//   4. for each episode whose assistant turn ended (<|end|>), parses it: tool calls run in the
//      environment and their results (rendered as tool turns plus a new assistant header, loss
//      mask 0) become the next pending tokens; a turn without tool calls ends the episode, which
//      the environment scores.
// Limits end an episode as truncated: max_turns assistant turns, max_turn_tokens per turn,
// max_episode_tokens in all. A turn that fails to parse ends the episode (format_error, scored as
// is). Weights can change between steps (UpdateWeights): episodes in flight continue under the
// new version, and every token records the version that produced it (partial rollouts).
//
// Single-threaded: one owner calls AddGroup / Step / UpdateWeights.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/philox.h"
#include "env/env.h"
#include "model/chat_format.h"
#include "rollout/policy_backend.h"
#include "rollout/sampling.h"
#include "rollout/trajectory.h"

namespace orrery::rollout {

struct AgentOptions {
  SamplingOptions sampling;
  int max_turns = 4;                // assistant turns per episode
  int max_turn_tokens = 96;         // generated tokens per assistant turn
  int max_episode_tokens = 512;     // all tokens of an episode (prompt and tools included)
  double env_timeout_seconds = 30;  // per Reset / tool call / Score
  uint64_t seed = 0;                // sampling stream of episode e is (seed, e's sequence number)
};

Status ValidateAgentOptions(const AgentOptions& options);

struct TrajectoryGroup {
  uint64_t group_id = 0;
  env::TaskRef task;
  std::vector<Trajectory> trajectories;  // G of them, in sample order
};

// Counters since construction.
struct AgentStats {
  int64_t episodes_started = 0, episodes_finished = 0, groups_finished = 0;
  int64_t tokens_generated = 0, tokens_fed = 0, tool_calls = 0, format_errors = 0;
  int64_t env_failures = 0, steps = 0;
};

class AgentLoop {
 public:
  // backend, format and env must outlive the loop.
  AgentLoop(PolicyBackend* backend, const ChatFormat* format, env::Env* env, AgentOptions options);
  ~AgentLoop();

  // Queues `group_size` episodes of `task` as one group.
  void AddGroup(const env::TaskRef& task, uint64_t group_id, int group_size);
  // One engine step (see above); returns the groups completed by it.
  StatusOr<std::vector<TrajectoryGroup>> Step();
  // Runs steps until every queued and active episode is done.
  StatusOr<std::vector<TrajectoryGroup>> RunUntilIdle();

  // New weights at `version`, applied before the next step's feed.
  Status UpdateWeights(const std::vector<std::pair<std::string, Tensor>>& named, int64_t version);
  int64_t version() const { return backend_->version(); }

  int active_episodes() const;
  int queued_episodes() const { return static_cast<int>(queue_.size()); }
  bool idle() const { return active_episodes() == 0 && queue_.empty(); }
  const AgentStats& stats() const { return stats_; }

 private:
  struct Episode;
  struct Group;

  Status StartEpisode(std::unique_ptr<Episode> episode, int slot);
  // Handles the end of an assistant turn; may finish the episode.
  Status EndTurn(Episode& e, bool finished_by_model);
  Status FinishEpisode(Episode& e, EpisodeStatus status);
  void AppendTokens(Episode& e, const std::vector<int32_t>& ids, TokenRole role);

  PolicyBackend* backend_;
  const ChatFormat* format_;
  env::Env* env_;
  AgentOptions options_;
  std::deque<std::unique_ptr<Episode>> queue_;
  std::vector<std::unique_ptr<Episode>> slots_;  // by backend slot; null when free
  std::vector<std::shared_ptr<Group>> groups_;
  uint64_t next_episode_ = 0;
  AgentStats stats_;
};

}  // namespace orrery::rollout
