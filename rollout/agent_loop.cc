#include "rollout/agent_loop.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>

#include "core/logging.h"

namespace orrery::rollout {
namespace {

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double NowMono() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs an Env call (Reset/Step/Score) so that no exception escapes: an environment is outside
// code, and one that throws fails its episode as an environment error, not the rollout actor.
template <typename Fn>
auto Guarded(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return InternalError(std::string("env ") + what + " threw: " + e.what());
  } catch (...) {
    return InternalError(std::string("env ") + what + " threw an unknown exception");
  }
}

EpisodeStatus FaultStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kDeadlineExceeded:
      return EpisodeStatus::kTimeout;
    case StatusCode::kUnavailable:
      return EpisodeStatus::kEnvLost;
    default:
      return EpisodeStatus::kToolError;
  }
}

}  // namespace

Status ValidateAgentOptions(const AgentOptions& o) {
  ORRERY_RETURN_IF_ERROR(ValidateSamplingOptions(o.sampling));
  if (o.max_turns < 1 || o.max_turn_tokens < 1 || o.max_episode_tokens < 2) {
    return InvalidArgumentError(
        "agent: max_turns, max_turn_tokens must be >= 1 and max_episode_tokens >= 2");
  }
  if (!(o.env_timeout_seconds > 0)) {
    return InvalidArgumentError("agent: env_timeout_seconds must be > 0");
  }
  if (o.env_workers < 0) return InvalidArgumentError("agent: env_workers must be >= 0");
  return Status::OK();
}

struct AgentLoop::Group {
  uint64_t group_id = 0;
  env::TaskRef task;
  std::vector<Trajectory> trajectories;
  int remaining = 0;
};

// One environment call of an episode: its inputs, and the outputs a worker fills in.
struct AgentLoop::EnvCall {
  enum Kind { kReset, kTools, kScore } kind = kReset;
  std::vector<ToolCall> calls;  // kTools: the turn's calls, run in order until one fails
  std::optional<StatusOr<std::unique_ptr<env::Episode>>> reset;
  std::vector<StatusOr<env::ToolResult>> tool_results;  // one per call run
  std::optional<StatusOr<env::EpisodeScore>> score;
  double seconds = 0;  // wall time of the call(s)
};

struct AgentLoop::Episode {
  std::shared_ptr<Group> group;
  int index = 0;  // within the group
  PhiloxGenerator rng{0, 0};
  std::unique_ptr<env::Episode> env_episode;
  std::vector<ChatMessage> messages;
  Trajectory traj;
  std::vector<int32_t> pending;  // tokens to feed next
  int64_t pending_start = 0;     // trajectory position of pending[0]
  std::vector<int32_t> turn_ids;
  int turns = 0;
  int slot = -1;
  double start_mono = 0;
  std::unique_ptr<EnvCall> env_call;  // in flight (set: the episode is not fed)
};

AgentLoop::AgentLoop(PolicyBackend* backend, const ChatFormat* format, env::Env* env,
                     AgentOptions options)
    : backend_(backend),
      format_(format),
      env_(env),
      options_(options),
      slots_(backend->max_slots()),
      env_pool_(std::make_unique<ThreadPool>(std::max(0, options.env_workers))) {}

AgentLoop::~AgentLoop() {
  env_pool_.reset();  // running calls end by their deadlines; then the episodes go
}

int AgentLoop::active_episodes() const {
  int n = 0;
  for (const auto& e : slots_) n += e != nullptr;
  return n;
}

void AgentLoop::AddGroup(const env::TaskRef& task, uint64_t group_id, int group_size) {
  auto group = std::make_shared<Group>();
  group->group_id = group_id;
  group->task = task;
  group->remaining = group_size;
  group->trajectories.resize(group_size);
  for (int i = 0; i < group_size; ++i) {
    auto e = std::make_unique<Episode>();
    e->group = group;
    e->index = i;
    e->rng = PhiloxGenerator(options_.seed, next_episode_++);
    queue_.push_back(std::move(e));
  }
  groups_.push_back(std::move(group));
}

void AgentLoop::AppendTokens(Episode& e, const std::vector<int32_t>& ids, TokenRole role) {
  Trajectory& t = e.traj;
  const int layers = backend_->moe_layers(), k = backend_->top_k();
  for (int32_t id : ids) {
    t.tokens.push_back(id);
    t.logprobs.push_back(0.0f);
    t.policy_versions.push_back(backend_->version());
    t.loss_mask.push_back(0);
    t.roles.push_back(role);
    t.turns.push_back(static_cast<uint16_t>(e.turns));
    for (int l = 0; l < layers; ++l) {
      for (int j = 0; j < k; ++j) t.routed_experts.push_back(static_cast<uint16_t>(j));
    }
  }
}

void AgentLoop::SubmitEnvCall(Episode& e, std::unique_ptr<EnvCall> call) {
  e.env_call = std::move(call);
  ++stats_.env_calls_in_flight;
  Episode* ep = &e;
  EnvCall* c = e.env_call.get();
  const env::TaskRef task = e.group->task;
  // The deadline starts when a worker takes the call: time queued behind other calls is not the
  // environment's.
  env_pool_->Submit([this, ep, c, task] {
    const double start = NowMono();
    const double timeout = options_.env_timeout_seconds;
    switch (c->kind) {
      case EnvCall::kReset:
        c->reset = Guarded("reset", [&] { return env_->Reset(task, env::DeadlineIn(timeout)); });
        break;
      case EnvCall::kTools:
        for (const ToolCall& call : c->calls) {
          c->tool_results.push_back(Guarded(
              "step", [&] { return ep->env_episode->Step(call, env::DeadlineIn(timeout)); }));
          if (!c->tool_results.back().ok()) break;
        }
        break;
      case EnvCall::kScore:
        c->score = Guarded("score", [&] {
          return ep->env_episode->Score(ep->messages, env::DeadlineIn(timeout));
        });
        break;
    }
    c->seconds = NowMono() - start;
    {
      std::lock_guard<std::mutex> lock(done_mu_);
      done_.push_back(ep);
    }
    done_cv_.notify_one();
  });
}

Status AgentLoop::ApplyEnvResults(int wait_ms) {
  std::vector<Episode*> batch;
  {
    std::unique_lock<std::mutex> lock(done_mu_);
    if (done_.empty() && wait_ms > 0) {
      done_cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return !done_.empty(); });
    }
    batch.swap(done_);
  }
  for (Episode* e : batch) {
    std::unique_ptr<EnvCall> call = std::move(e->env_call);
    --stats_.env_calls_in_flight;
    switch (call->kind) {
      case EnvCall::kReset:
        ORRERY_RETURN_IF_ERROR(OnReset(*e, *call));
        break;
      case EnvCall::kTools:
        ORRERY_RETURN_IF_ERROR(OnToolResults(*e, *call));
        break;
      case EnvCall::kScore:
        OnScore(*e, *call);
        break;
    }
  }
  return Status::OK();
}

void AgentLoop::StartEpisode(std::unique_ptr<Episode> owned, int slot) {
  Episode& e = *owned;
  e.slot = slot;
  e.start_mono = NowMono();
  Trajectory& t = e.traj;
  t.task_id = e.group->task.id;
  t.env_name = env_->name();
  t.group_id = e.group->group_id;
  t.seed = e.group->task.seed;
  t.moe_layers = backend_->moe_layers();
  t.top_k = backend_->top_k();
  t.start_unix_seconds = NowUnix();
  slots_[slot] = std::move(owned);
  ++stats_.episodes_started;
  auto call = std::make_unique<EnvCall>();
  call->kind = EnvCall::kReset;
  SubmitEnvCall(e, std::move(call));
}

Status AgentLoop::OnReset(Episode& e, EnvCall& call) {
  Trajectory& t = e.traj;
  if (!call.reset->ok()) {
    FailEpisode(e, call.reset->status(), "reset");
    return Status::OK();
  }
  e.env_episode = std::move(**call.reset);
  e.messages = e.env_episode->initial_messages();
  ORRERY_ASSIGN_OR_RETURN(RenderedChat prompt, format_->RenderPrompt(e.messages));
  e.pending_start = t.size();
  // A prompt that leaves no room for one model token can never be trained on. It is the task's
  // (an environment, maybe a plug-in, chose it), so it ends this episode as a counted, logged
  // environment fault (masked, not trained as reward 0) rather than the actor: a configuration
  // where every prompt is too long shows as one such line per episode and in the fault counters.
  if (static_cast<int64_t>(prompt.ids.size()) >= options_.max_episode_tokens) {
    FailEpisode(
        e,
        InvalidArgumentError("max_episode_tokens = " + std::to_string(options_.max_episode_tokens) +
                             " leaves no room to generate: the prompt of task " + t.task_id +
                             " is " + std::to_string(prompt.ids.size()) +
                             " tokens (expected max_episode_tokens above it)"),
        "prompt");
    return Status::OK();
  }
  AppendTokens(e, prompt.ids, TokenRole::kPrompt);
  e.pending = prompt.ids;
  return Status::OK();
}

void AgentLoop::FailEpisode(Episode& e, const Status& status, const char* what) {
  ++stats_.env_failures;
  const EpisodeStatus fault = FaultStatus(status);
  ++(fault == EpisodeStatus::kTimeout   ? stats_.env_timeouts
     : fault == EpisodeStatus::kEnvLost ? stats_.env_lost
                                        : stats_.env_tool_errors);
  ORRERY_LOG(WARN) << "env " << what << " of " << e.traj.task_id << " failed ("
                   << EpisodeStatusName(fault) << "): " << status.ToString();
  FinishEpisode(e, fault);
}

void AgentLoop::FinishEpisode(Episode& e, EpisodeStatus status) {
  e.traj.status = status;
  e.pending.clear();
  std::unique_ptr<Episode> owned;
  if (e.slot >= 0) {
    backend_->Release(e.slot);
    owned = std::move(slots_[e.slot]);
    e.slot = -1;
  }
  if (e.env_episode == nullptr || e.traj.env_fault()) {
    CompleteEpisode(e);  // `owned` frees the episode on return
    return;
  }
  auto call = std::make_unique<EnvCall>();
  call->kind = EnvCall::kScore;
  Episode* key = owned.get();
  scoring_[key] = std::move(owned);
  SubmitEnvCall(*key, std::move(call));
}

void AgentLoop::OnScore(Episode& e, EnvCall& call) {
  Trajectory& t = e.traj;
  t.reward_seconds = call.seconds;
  if (call.score->ok()) {
    t.reward = (*call.score)->reward;
    t.reward_components = (*call.score)->components;
  } else {
    // The environment could not score it: an environment fault, not a reward of 0.
    ++stats_.env_failures;
    const EpisodeStatus fault = FaultStatus(call.score->status());
    ++(fault == EpisodeStatus::kTimeout   ? stats_.env_timeouts
       : fault == EpisodeStatus::kEnvLost ? stats_.env_lost
                                          : stats_.env_tool_errors);
    t.status = fault;
    t.reward = 0;
    ORRERY_LOG(WARN) << "scoring " << t.task_id << " failed (" << EpisodeStatusName(fault)
                     << "): " << call.score->status().ToString();
  }
  std::unique_ptr<Episode> owned = std::move(scoring_[&e]);
  scoring_.erase(&e);
  CompleteEpisode(e);
}

void AgentLoop::CompleteEpisode(Episode& e) {
  Trajectory& t = e.traj;
  t.total_seconds = NowMono() - e.start_mono;
  stats_.episodes_finished++;
  Group& g = *e.group;
  g.trajectories[e.index] = std::move(t);
  --g.remaining;
}

Status AgentLoop::EndTurn(Episode& e, bool finished_by_model) {
  Trajectory& t = e.traj;
  ++e.turns;
  if (!finished_by_model) {
    FinishEpisode(e, EpisodeStatus::kTruncated);
    return Status::OK();
  }
  auto parsed = format_->ParseAssistantTurn(e.turn_ids);
  e.turn_ids.clear();
  if (!parsed.ok()) {
    ++stats_.format_errors;
    t.format_error = true;
    FinishEpisode(e, EpisodeStatus::kFinished);
    return Status::OK();
  }
  e.messages.push_back(parsed->message);
  const std::vector<ToolCall>& calls = parsed->message.tool_calls;
  if (calls.empty()) {
    FinishEpisode(e, EpisodeStatus::kFinished);
  } else if (e.turns >= options_.max_turns) {
    FinishEpisode(e, EpisodeStatus::kTruncated);
  } else {
    auto call = std::make_unique<EnvCall>();
    call->kind = EnvCall::kTools;
    call->calls = calls;
    stats_.tool_calls += static_cast<int64_t>(calls.size());
    SubmitEnvCall(e, std::move(call));
  }
  return Status::OK();
}

Status AgentLoop::OnToolResults(Episode& e, EnvCall& call) {
  Trajectory& t = e.traj;
  t.tool_seconds += call.seconds;
  std::vector<ChatMessage> results;
  for (size_t i = 0; i < call.tool_results.size(); ++i) {
    const ToolCall& c = call.calls[i];
    const StatusOr<env::ToolResult>& r = call.tool_results[i];
    ToolCallRecord rec;
    rec.name = c.name;
    rec.arguments_json = c.arguments_json;
    rec.turn = static_cast<uint32_t>(e.turns - 1);
    if (!r.ok()) {
      rec.error = r.status().ToString();
      t.tool_calls.push_back(rec);
      FailEpisode(e, r.status(), "step");
      return Status::OK();
    }
    rec.result = r->content;
    rec.latency_ms = r->latency_s * 1e3;
    if (r->is_error) rec.error = r->content;
    t.tool_calls.push_back(rec);
    ChatMessage m;
    m.role = ChatRole::kTool;
    m.content = r->content;
    m.tool_call_id = c.id;
    m.name = c.name;
    results.push_back(m);
  }
  e.messages.insert(e.messages.end(), results.begin(), results.end());
  ORRERY_ASSIGN_OR_RETURN(RenderedChat tail, format_->RenderPrompt(results));
  if (t.size() + static_cast<int64_t>(tail.ids.size()) + 1 > options_.max_episode_tokens) {
    FinishEpisode(e, EpisodeStatus::kTruncated);
    return Status::OK();
  }
  // The turn's closing token was sampled but not fed yet: it goes first.
  e.pending_start = t.size() - static_cast<int64_t>(e.pending.size());
  AppendTokens(e, tail.ids, TokenRole::kTool);
  // The new assistant header is the chat format's, not the tool's.
  t.roles.back() = TokenRole::kPrompt;
  e.pending.insert(e.pending.end(), tail.ids.begin(), tail.ids.end());
  return Status::OK();
}

StatusOr<std::vector<TrajectoryGroup>> AgentLoop::Step() {
  ++stats_.steps;
  // 1. Fill free slots (their Resets go to the env workers).
  for (size_t s = 0; s < slots_.size() && !queue_.empty(); ++s) {
    if (slots_[s] != nullptr) continue;
    std::unique_ptr<Episode> e = std::move(queue_.front());
    queue_.pop_front();
    StartEpisode(std::move(e), static_cast<int>(s));
  }
  // 2. Finished env calls; wait for one when nothing could be fed otherwise.
  auto feedable = [&] {
    for (const auto& e : slots_) {
      if (e != nullptr && e->env_call == nullptr && !e->pending.empty()) return true;
    }
    return false;
  };
  ORRERY_RETURN_IF_ERROR(ApplyEnvResults(0));
  if (!feedable() && stats_.env_calls_in_flight > 0) {
    ORRERY_RETURN_IF_ERROR(ApplyEnvResults(kEnvWaitMs));
  }
  // 3. Feed every episode that is not waiting for the environment.
  std::vector<int> feed_slots;
  std::vector<std::vector<int32_t>> feeds;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s] != nullptr && slots_[s]->env_call == nullptr && !slots_[s]->pending.empty()) {
      feed_slots.push_back(static_cast<int>(s));
      feeds.push_back(slots_[s]->pending);
    }
  }
  if (!feed_slots.empty()) {
    const double gen_start = NowMono();
    // Each episode's uniform number from its own stream: the backend draws with it (on the
    // device for the GPU backend), so the seed reproduces the episode either way.
    std::vector<SlotDraw> draws;
    draws.reserve(feed_slots.size());
    for (int s : feed_slots) draws.push_back({options_.sampling, slots_[s]->rng.Uniform()});
    ORRERY_ASSIGN_OR_RETURN(SampledFeed out, backend_->FeedAndSample(feed_slots, feeds, draws));
    const int layers = backend_->moe_layers(), k = backend_->top_k();
    const int64_t fed_total = out.expert_ids.defined() && layers > 0 ? out.expert_ids.dim(1) : 0;
    if (out.tokens.size() != feed_slots.size()) {
      return InternalError("agent loop: the backend drew " + std::to_string(out.tokens.size()) +
                           " tokens for " + std::to_string(feed_slots.size()) + " slots");
    }
    int64_t at = 0;
    for (size_t i = 0; i < feed_slots.size(); ++i) {
      Episode& e = *slots_[feed_slots[i]];
      Trajectory& t = e.traj;
      const int64_t n = static_cast<int64_t>(e.pending.size());
      stats_.tokens_fed += n;
      for (int64_t p = 0; p < n && fed_total > 0; ++p) {
        for (int l = 0; l < layers; ++l) {
          const int32_t* src = out.expert_ids.data<int32_t>() + (l * fed_total + at + p) * k;
          uint16_t* dst = t.routed_experts.data() + ((e.pending_start + p) * layers + l) * k;
          for (int j = 0; j < k; ++j) dst[j] = static_cast<uint16_t>(src[j]);
        }
      }
      at += n;
      e.pending.clear();
      // 4. The token drawn for it.
      const SampledToken tok = out.tokens[i];
      e.pending_start = t.size();
      AppendTokens(e, {tok.id}, TokenRole::kModel);
      t.logprobs.back() = tok.logprob;
      t.loss_mask.back() = 1;
      e.turn_ids.push_back(tok.id);
      ++stats_.tokens_generated;
      e.pending = {tok.id};
    }
    const double gen_seconds = NowMono() - gen_start;
    // 5. Turn ends and limits.
    for (int s : feed_slots) {
      Episode& e = *slots_[s];
      e.traj.generation_seconds += gen_seconds;
      const int32_t last = e.turn_ids.back();
      if (last == format_->end_of_turn_id() || last == format_->end_of_text_id()) {
        ORRERY_RETURN_IF_ERROR(EndTurn(e, true));
      } else if (static_cast<int>(e.turn_ids.size()) >= options_.max_turn_tokens ||
                 e.traj.size() >= options_.max_episode_tokens) {
        ORRERY_RETURN_IF_ERROR(EndTurn(e, false));
      }
    }
  }
  // Calls that finished meanwhile (all of this step's, when they run on this thread).
  ORRERY_RETURN_IF_ERROR(ApplyEnvResults(0));
  // Completed groups, in the order they were added.
  std::vector<TrajectoryGroup> done;
  std::vector<std::shared_ptr<Group>> keep;
  for (auto& g : groups_) {
    if (g->remaining > 0) {
      keep.push_back(std::move(g));
      continue;
    }
    TrajectoryGroup out;
    out.group_id = g->group_id;
    out.task = g->task;
    out.trajectories = std::move(g->trajectories);
    done.push_back(std::move(out));
    ++stats_.groups_finished;
  }
  groups_ = std::move(keep);
  return done;
}

StatusOr<std::vector<TrajectoryGroup>> AgentLoop::RunUntilIdle() {
  std::vector<TrajectoryGroup> all;
  while (!idle()) {
    ORRERY_ASSIGN_OR_RETURN(std::vector<TrajectoryGroup> groups, Step());
    for (auto& g : groups) all.push_back(std::move(g));
  }
  return all;
}

Status AgentLoop::UpdateWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                                int64_t version) {
  return backend_->LoadWeights(named, version);
}

}  // namespace orrery::rollout
