// AgentLoop: multi-turn tool-using episodes on a continuous-batching generation engine.
//
// Groups of G episodes of one task are queued with AddGroup. Each Step():
//   1. admits queued episodes into free slots, oldest first, while the backend's context pool has
//      room for their first feed (admission control, below); a new episode's env Reset is issued
//      (prompt = the chat format's rendering of the initial messages with an open assistant turn);
//   2. applies the environment calls that finished since the last step (see below); when no
//      episode has tokens to feed but calls are running, waits for one (at most kEnvWaitMs);
//   3. copies each group's shared prompt to the episodes waiting for it (shared prompts, below);
//   4. plans the step's feed within the token budget max_step_tokens (continuous batching): first
//      every decoding episode (its one token sampled last step), then the other pending tokens
//      (prompts, tool results), oldest episode first, in chunks that fill the rest of the budget,
//      so a long prompt or tool result is fed over several steps beside the decodes; every feed
//      must also fit the backend's free context (admission control);
//   5. feeds the plan, recording the routed experts of each fed token, and samples one token for
//      each episode whose pending tokens are now all fed (temperature / top-p), recording its
//      behaviour log-prob and the policy version: one PolicyBackend::FeedAndSample call, with the
//      uniform number of each draw taken from the episode's own Philox stream (the GPU backend
//      samples on the device, the CPU one on the host, by the same rule), beside one Feed call
//      for the chunks that end before their episode's last pending token (not sampled);
//   6. for each episode whose assistant turn ended (<|end|>), parses it: tool calls go to the
//      environment and their results (rendered as tool turns plus a new assistant header, loss
//      mask 0) become the next pending tokens; a turn without tool calls ends the episode, which
//      the environment scores.
// A trajectory depends only on its episode's stream and the backend's numbers, not on the
// schedule: a budget, waits or shared prompts give the same tokens (behaviour logprobs within the
// backend's determinism: a prompt fed in chunks or as a copy rounds differently).
//
// Shared prompts (share_prompts): the episodes of a group usually get the same prompt. The first
// whose Reset returns leads: it feeds its prompt but the last token, while the siblings with the
// same prompt wait. Once that prefix is in and no sibling's Reset is still running, the backend
// copies the leader's slot to theirs (CopySlot: pages shared on the GPU), and each of them, the
// leader too, feeds the prompt's last token as a decode and samples on from there: the prompt is
// prefilled once, not G times, and the siblings' R3 experts for it are the leader's. A sibling
// whose Reset returns after the copy, or with another prompt, feeds its own.
//
// Admission control: the backend holds contexts in a pool (PolicyBackend::free_context: latent
// pages on the GPU; unlimited on the CPU unless configured). A queued episode takes a slot only
// when its first feed (its group's prompt, once known) fits in the free context less what waiting
// feeds need; a planned feed that does not fit waits, and later episodes' prompts do not overtake
// it (both counted in AgentStats). No episode is truncated or failed for want of context. When
// nothing at all can be fed for want of it, the youngest episode younger than the oldest waiting
// one that holds context and has no env call in flight is preempted: its slot is released and it
// returns to the head of the queue; readmitted once its whole context fits, it feeds that context
// again (its recorded tokens, logprobs, versions and R3 experts are kept). An episode that does
// not fit even alone is an error of the step (the pool is smaller than max_episode_tokens needs).
//
// Environment calls (Reset, a turn's tool calls, Score) run off the decode loop on env_workers
// threads: an episode waiting for one leaves the decode batch (keeping its backend slot and
// context) while the others keep decoding, so one slow sandboxed call stalls only its own
// episode. A scored episode frees its backend slot at once; its group completes when the score
// arrives. With env_workers = 0 the calls run on the loop's thread as they are issued.
//
// Environment faults (env/env.h: a non-OK Status from Reset, Step or Score) end the episode with
// a fault status: kTimeout (DeadlineExceeded), kEnvLost (Unavailable: the worker holding the
// episode is gone) or kToolError (anything else). Such an episode is not scored (Trajectory::
// env_fault(): the learner does not train on it), and each is counted in AgentStats.
// Limits end an episode as truncated: max_turns assistant turns, max_turn_tokens per turn,
// max_episode_tokens in all. A turn that fails to parse ends the episode (format_error, scored as
// is). Weights can change between steps (UpdateWeights): episodes in flight continue under the
// new version, and every token records the version that produced it (partial rollouts).
//
// One owner thread calls AddGroup / Step / UpdateWeights; only env calls run elsewhere.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/thread_pool.h"
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
  // Threads running environment calls (see above). An episode has at most one call in flight,
  // so the backend's slots are enough for no call to queue (the rollout role's choice, the same
  // rule as the sandbox pools' size). 0: on the loop's thread.
  int env_workers = 0;
  // Most tokens one step feeds (decodes and prefill chunks together); 0: no bound. At least the
  // backend's max_slots, so that every decoding episode is fed each step.
  int64_t max_step_tokens = 0;
  bool share_prompts = true;  // a group's shared prompt fed once (see above)
};

// The longest a Step waits for an environment call when no episode can be fed: the owner's loop
// regains control this often (weight polls, stop requests) while every episode waits on tools.
inline constexpr int kEnvWaitMs = 20;

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
  // Episodes ended by an environment fault, by kind (their sum is at most env_failures: a failed
  // Score of a finished episode is a fault too).
  int64_t env_tool_errors = 0, env_timeouts = 0, env_lost = 0;
  int64_t env_calls_in_flight = 0;  // now
  // Scheduling (see above): steps in which the queue's head waited for context; feeds that waited
  // because the free context could not hold them; episodes preempted to free context; prompt
  // tokens not fed thanks to a copied group prompt; feeds cut short (by the budget or the free
  // context).
  int64_t admission_waits = 0, context_waits = 0, preemptions = 0, prompt_tokens_shared = 0;
  int64_t chunked_feeds = 0;
  // Episodes ended as truncated, by the limit that ended them: max_episode_tokens (the context:
  // a turn or a tool result that would not fit), max_turn_tokens (a turn without its end), and
  // max_turns (tool calls still asked for after the last turn allowed).
  int64_t truncated_context = 0, truncated_turn_tokens = 0, truncated_turns = 0;
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

  // Episodes holding a backend slot (decoding or waiting for a tool), and those being scored.
  int active_episodes() const;
  int scoring_episodes() const { return static_cast<int>(scoring_.size()); }
  int queued_episodes() const { return static_cast<int>(queue_.size()); }
  bool idle() const { return active_episodes() == 0 && scoring_.empty() && queue_.empty(); }
  const AgentStats& stats() const { return stats_; }

 private:
  struct Episode;
  struct Group;
  struct EnvCall;
  struct StepPlan;

  // Step's parts (see above).
  void Admit();
  Status SharePrompts();
  StepPlan PlanFeeds();
  Status RunFeeds(const StepPlan& plan);
  // Preempts the youngest episode younger than `waiter` that holds context and has no env call
  // in flight; false when there is none.
  bool Preempt(const Episode& waiter);
  // Tokens of `e`'s trajectory it may feed now (a leader stops before its prompt's last token).
  int64_t FeedLimit(const Episode& e) const;
  bool Feedable(const Episode& e) const;
  // A leaving leader hands its group's shared prompt to a waiting sibling (or ends the sharing).
  void LeaveShare(Episode& e);

  // Takes slot `slot` (a new episode: its Reset is issued; a preempted one: its context is fed
  // again).
  void StartEpisode(std::unique_ptr<Episode> episode, int slot);
  // Handles the end of an assistant turn; may finish the episode.
  Status EndTurn(Episode& e, bool finished_by_model);
  // Ends the episode: frees its backend slot, then scores it (a normal end) or completes it.
  void FinishEpisode(Episode& e, EpisodeStatus status);
  // Ends the episode for the environment fault `status`.
  void FailEpisode(Episode& e, const Status& status, const char* what);
  void CompleteEpisode(Episode& e);
  void AppendTokens(Episode& e, const std::vector<int32_t>& ids, TokenRole role);

  // Runs `call` for `e` on an env worker; its result is applied by ApplyEnvResults.
  void SubmitEnvCall(Episode& e, std::unique_ptr<EnvCall> call);
  // Applies finished env calls (waiting up to wait_ms for the first one when none has finished).
  Status ApplyEnvResults(int wait_ms);
  Status OnReset(Episode& e, EnvCall& call);
  Status OnToolResults(Episode& e, EnvCall& call);
  void OnScore(Episode& e, EnvCall& call);

  PolicyBackend* backend_;
  const ChatFormat* format_;
  env::Env* env_;
  AgentOptions options_;
  std::deque<std::unique_ptr<Episode>> queue_;
  std::vector<std::unique_ptr<Episode>> slots_;           // by backend slot; null when free
  std::map<Episode*, std::unique_ptr<Episode>> scoring_;  // ended, waiting for their score
  std::vector<std::shared_ptr<Group>> groups_;
  uint64_t next_episode_ = 0;
  AgentStats stats_;
  int64_t waiting_cost_ = 0;  // the context the feeds that waited last step need

  // Finished env calls, handed from the workers to the loop's thread.
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::vector<Episode*> done_;
  std::unique_ptr<ThreadPool> env_pool_;  // destroyed first (~AgentLoop joins it)
};

}  // namespace orrery::rollout
