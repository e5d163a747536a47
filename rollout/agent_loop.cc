#include "rollout/agent_loop.h"

#include <chrono>
#include <exception>
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
  return Status::OK();
}

struct AgentLoop::Group {
  uint64_t group_id = 0;
  env::TaskRef task;
  std::vector<Trajectory> trajectories;
  int remaining = 0;
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
};

AgentLoop::AgentLoop(PolicyBackend* backend, const ChatFormat* format, env::Env* env,
                     AgentOptions options)
    : backend_(backend),
      format_(format),
      env_(env),
      options_(options),
      slots_(backend->max_slots()) {}

AgentLoop::~AgentLoop() = default;

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

Status AgentLoop::StartEpisode(std::unique_ptr<Episode> owned, int slot) {
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

  auto reset = Guarded("reset", [&] {
    return env_->Reset(e.group->task, env::DeadlineIn(options_.env_timeout_seconds));
  });
  if (!reset.ok()) {
    ++stats_.env_failures;
    ORRERY_LOG(WARN) << "env reset of " << t.task_id << " failed: " << reset.status().ToString();
    return FinishEpisode(e, reset.status().code() == StatusCode::kDeadlineExceeded
                                ? EpisodeStatus::kTimeout
                                : EpisodeStatus::kToolError);
  }
  e.env_episode = std::move(*reset);
  e.messages = e.env_episode->initial_messages();
  ORRERY_ASSIGN_OR_RETURN(RenderedChat prompt, format_->RenderPrompt(e.messages));
  e.pending_start = t.size();
  AppendTokens(e, prompt.ids, TokenRole::kPrompt);
  e.pending = prompt.ids;
  if (t.size() >= options_.max_episode_tokens) return FinishEpisode(e, EpisodeStatus::kTruncated);
  return Status::OK();
}

Status AgentLoop::FinishEpisode(Episode& e, EpisodeStatus status) {
  Trajectory& t = e.traj;
  t.status = status;
  if (e.env_episode != nullptr) {
    const double start = NowMono();
    auto score = Guarded("score", [&] {
      return e.env_episode->Score(e.messages, env::DeadlineIn(options_.env_timeout_seconds));
    });
    t.reward_seconds = NowMono() - start;
    if (score.ok()) {
      t.reward = score->reward;
      t.reward_components = score->components;
    } else {
      ++stats_.env_failures;
      t.reward = 0;
      ORRERY_LOG(WARN) << "scoring " << t.task_id << " failed: " << score.status().ToString();
    }
  }
  t.total_seconds = NowMono() - e.start_mono;
  stats_.episodes_finished++;
  backend_->Release(e.slot);
  Group& g = *e.group;
  g.trajectories[e.index] = std::move(t);
  --g.remaining;
  e.pending.clear();
  e.slot = -1;
  return Status::OK();
}

Status AgentLoop::EndTurn(Episode& e, bool finished_by_model) {
  Trajectory& t = e.traj;
  ++e.turns;
  if (!finished_by_model) return FinishEpisode(e, EpisodeStatus::kTruncated);
  auto parsed = format_->ParseAssistantTurn(e.turn_ids);
  e.turn_ids.clear();
  if (!parsed.ok()) {
    ++stats_.format_errors;
    t.format_error = true;
    return FinishEpisode(e, EpisodeStatus::kFinished);
  }
  e.messages.push_back(parsed->message);
  const std::vector<ToolCall>& calls = parsed->message.tool_calls;
  if (calls.empty()) return FinishEpisode(e, EpisodeStatus::kFinished);
  if (e.turns >= options_.max_turns) return FinishEpisode(e, EpisodeStatus::kTruncated);

  std::vector<ChatMessage> results;
  const double start = NowMono();
  for (const ToolCall& call : calls) {
    ++stats_.tool_calls;
    auto r = Guarded("step", [&] {
      return e.env_episode->Step(call, env::DeadlineIn(options_.env_timeout_seconds));
    });
    ToolCallRecord rec;
    rec.name = call.name;
    rec.arguments_json = call.arguments_json;
    rec.turn = static_cast<uint32_t>(e.turns - 1);
    if (!r.ok()) {
      ++stats_.env_failures;
      rec.error = r.status().ToString();
      t.tool_calls.push_back(rec);
      t.tool_seconds += NowMono() - start;
      return FinishEpisode(e, r.status().code() == StatusCode::kDeadlineExceeded
                                  ? EpisodeStatus::kTimeout
                                  : EpisodeStatus::kToolError);
    }
    rec.result = r->content;
    rec.latency_ms = r->latency_s * 1e3;
    if (r->is_error) rec.error = r->content;
    t.tool_calls.push_back(rec);
    ChatMessage m;
    m.role = ChatRole::kTool;
    m.content = r->content;
    m.tool_call_id = call.id;
    m.name = call.name;
    results.push_back(m);
  }
  t.tool_seconds += NowMono() - start;
  e.messages.insert(e.messages.end(), results.begin(), results.end());
  ORRERY_ASSIGN_OR_RETURN(RenderedChat tail, format_->RenderPrompt(results));
  if (t.size() + static_cast<int64_t>(tail.ids.size()) + 1 > options_.max_episode_tokens) {
    return FinishEpisode(e, EpisodeStatus::kTruncated);
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
  // 1. Fill free slots.
  for (size_t s = 0; s < slots_.size() && !queue_.empty(); ++s) {
    if (slots_[s] != nullptr) continue;
    std::unique_ptr<Episode> e = std::move(queue_.front());
    queue_.pop_front();
    ORRERY_RETURN_IF_ERROR(StartEpisode(std::move(e), static_cast<int>(s)));
    if (slots_[s]->slot < 0) slots_[s].reset();  // finished at once (env failure)
  }
  // 2. Feed every active episode.
  std::vector<int> feed_slots;
  std::vector<std::vector<int32_t>> feeds;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s] != nullptr && !slots_[s]->pending.empty()) {
      feed_slots.push_back(static_cast<int>(s));
      feeds.push_back(slots_[s]->pending);
    }
  }
  if (!feed_slots.empty()) {
    const double gen_start = NowMono();
    ORRERY_ASSIGN_OR_RETURN(FeedResult out, backend_->Feed(feed_slots, feeds));
    const int layers = backend_->moe_layers(), k = backend_->top_k();
    const int64_t fed_total = out.expert_ids.defined() && layers > 0 ? out.expert_ids.dim(1) : 0;
    const int64_t v = backend_->vocab_size();
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
      // 3. Sample.
      SampledToken tok = SampleToken(out.logits.data<float>() + i * v, v, options_.sampling, e.rng);
      e.pending_start = t.size();
      AppendTokens(e, {tok.id}, TokenRole::kModel);
      t.logprobs.back() = tok.logprob;
      t.loss_mask.back() = 1;
      e.turn_ids.push_back(tok.id);
      ++stats_.tokens_generated;
      e.pending = {tok.id};
    }
    const double gen_seconds = NowMono() - gen_start;
    // 4. Turn ends and limits.
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
      if (e.slot < 0) slots_[s].reset();
    }
  }
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
