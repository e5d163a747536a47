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
  if (o.max_step_tokens < 0) {
    return InvalidArgumentError("agent: max_step_tokens = " + std::to_string(o.max_step_tokens) +
                                " (expected 0: no bound, or at least the backend's slots)");
  }
  return Status::OK();
}

struct AgentLoop::Group {
  uint64_t group_id = 0;
  env::TaskRef task;
  std::vector<Trajectory> trajectories;
  int remaining = 0;
  // Shared prompts: the episode feeding the prompt's prefix while siblings wait for a copy of it
  // (null: none), and the prompt's length once a Reset has returned (admission's estimate).
  Episode* leader = nullptr;
  int64_t prompt_tokens = 0;
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
  int index = 0;     // within the group
  uint64_t seq = 0;  // queue order: older episodes are served first
  PhiloxGenerator rng{0, 0};
  std::unique_ptr<env::Episode> env_episode;
  std::vector<ChatMessage> messages;
  Trajectory traj;
  // traj.tokens[0, fed) are in the backend slot's context, the rest wait to be fed; the routed
  // experts of [0, routed) are recorded (kept when a preempted episode feeds its context again).
  int64_t fed = 0, routed = 0;
  int64_t prompt_tokens = 0;
  bool started = false;    // its Reset was issued (a preempted episode resumes without one)
  bool fork_wait = false;  // waits for its group's leader to share the prompt
  std::vector<int32_t> turn_ids;
  int turns = 0;
  int slot = -1;
  double start_mono = 0;
  std::unique_ptr<EnvCall> env_call;  // in flight (set: the episode is not fed)
};

// One step's feed: per episode the number of its pending tokens fed.
struct AgentLoop::StepPlan {
  struct Item {
    Episode* episode;
    int64_t tokens;
  };
  std::vector<Item> sampled;    // reaching the episode's last pending token: a token is drawn
  std::vector<Item> unsampled;  // chunks (and a leader's prefix) ending before it
  Episode* waiter = nullptr;    // the oldest episode whose feed did not fit the free context
  int64_t waiting_cost = 0;     // the context the waiting feeds need
  int64_t waits = 0;            // feeds that did not fit
  int64_t chunked = 0;          // feeds cut short by the budget or the free context
  bool empty() const { return sampled.empty() && unsampled.empty(); }
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
    e->seq = next_episode_;
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
  if (e.started) {  // preempted: its whole context is pending again
    e.fed = 0;
    slots_[slot] = std::move(owned);
    return;
  }
  e.started = true;
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
  e.prompt_tokens = t.size();
  Group& g = *e.group;
  g.prompt_tokens = e.prompt_tokens;
  if (options_.share_prompts && e.prompt_tokens >= 2) {
    if (g.leader == nullptr) {
      g.leader = &e;
    } else if (g.leader->prompt_tokens == e.prompt_tokens &&
               std::equal(t.tokens.begin(), t.tokens.end(), g.leader->traj.tokens.begin())) {
      e.fork_wait = true;
    }
  }
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
  LeaveShare(e);
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
    ++stats_.truncated_turns;
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
    ++stats_.truncated_context;
    FinishEpisode(e, EpisodeStatus::kTruncated);
    return Status::OK();
  }
  // The turn's closing token was sampled but not fed yet: it is fed first, with these.
  AppendTokens(e, tail.ids, TokenRole::kTool);
  // The new assistant header is the chat format's, not the tool's.
  t.roles.back() = TokenRole::kPrompt;
  return Status::OK();
}

int64_t AgentLoop::FeedLimit(const Episode& e) const {
  return e.group->leader == &e ? e.prompt_tokens - 1 : e.traj.size();
}

bool AgentLoop::Feedable(const Episode& e) const {
  return e.slot >= 0 && e.env_call == nullptr && !e.fork_wait && e.fed < FeedLimit(e);
}

void AgentLoop::LeaveShare(Episode& e) {
  Group& g = *e.group;
  if (g.leader != &e) return;
  g.leader = nullptr;
  for (const auto& o : slots_) {
    if (o != nullptr && o->group.get() == &g && o->fork_wait) {
      o->fork_wait = false;  // it feeds the prefix now, the others wait for it
      g.leader = o.get();
      return;
    }
  }
}

void AgentLoop::Admit() {
  // Room for new episodes: the free context less what the feeds that waited last step need.
  const int64_t free = backend_->free_context();
  int64_t room = free > waiting_cost_ ? free - waiting_cost_ : 0;
  for (size_t s = 0; s < slots_.size() && !queue_.empty(); ++s) {
    if (slots_[s] != nullptr) continue;
    const int slot = static_cast<int>(s);
    const Episode& e = *queue_.front();
    const Group& g = *e.group;
    // Its first feed: a preempted episode's whole context; a new one's prompt, a copy of its
    // group's when a leader shares it, else its length when a sibling's Reset told it (1 before).
    int64_t cost = 0;
    if (e.started) {
      cost = backend_->FeedCost(slot, e.traj.size());
    } else if (g.leader != nullptr && g.leader->slot >= 0) {
      cost = backend_->CopyCost(g.leader->slot) + backend_->FeedCost(slot, 1);
    } else {
      cost = backend_->FeedCost(slot, std::max<int64_t>(1, g.prompt_tokens));
    }
    // With no episode holding a slot nothing else can free context: it goes in, and a feed that
    // cannot fit even then is the step's error.
    if (cost > room && active_episodes() > 0) {
      ++stats_.admission_waits;
      return;
    }
    room = cost < room ? room - cost : 0;
    std::unique_ptr<Episode> next = std::move(queue_.front());
    queue_.pop_front();
    StartEpisode(std::move(next), slot);
  }
}

Status AgentLoop::SharePrompts() {
  for (const auto& gp : groups_) {
    Group& g = *gp;
    if (g.leader == nullptr) continue;
    Episode& lead = *g.leader;
    std::vector<Episode*> members;
    bool resetting = false;  // a sibling's prompt may still come
    for (const auto& e : slots_) {
      if (e == nullptr || e.get() == &lead || e->group.get() != &g) continue;
      if (e->fork_wait) {
        members.push_back(e.get());
      } else if (e->env_call != nullptr && e->env_call->kind == EnvCall::kReset) {
        resetting = true;
      }
    }
    if (members.empty() && !resetting) {
      g.leader = nullptr;  // no one to share with: the leader feeds the rest of its prompt
      continue;
    }
    const int64_t prefix = lead.prompt_tokens - 1;
    if (lead.fed < prefix || resetting) continue;
    g.leader = nullptr;
    const int layers = backend_->moe_layers(), k = backend_->top_k();
    const int64_t routed = prefix * layers * k;
    for (Episode* m : members) {
      m->fork_wait = false;
      // Without room for a copy (a CPU pool), it feeds its own prompt, waiting for context.
      if (backend_->CopyCost(lead.slot) > backend_->free_context()) continue;
      ORRERY_RETURN_IF_ERROR(backend_->CopySlot(lead.slot, m->slot));
      std::copy_n(lead.traj.routed_experts.begin(), routed, m->traj.routed_experts.begin());
      m->fed = m->routed = prefix;
      stats_.prompt_tokens_shared += prefix;
    }
  }
  return Status::OK();
}

AgentLoop::StepPlan AgentLoop::PlanFeeds() {
  StepPlan plan;
  int64_t budget =
      options_.max_step_tokens > 0 ? options_.max_step_tokens : PolicyBackend::kUnlimited;
  int64_t free = backend_->free_context();
  std::vector<Episode*> ready;
  for (const auto& e : slots_) {
    if (e != nullptr && Feedable(*e)) ready.push_back(e.get());
  }
  std::sort(ready.begin(), ready.end(),
            [](const Episode* a, const Episode* b) { return a->seq < b->seq; });
  auto wait = [&](Episode& e, int64_t cost) {
    ++plan.waits;
    plan.waiting_cost += cost;
    if (plan.waiter == nullptr || e.seq < plan.waiter->seq) plan.waiter = &e;
  };
  auto add = [&](Episode& e, int64_t m, int64_t cost) {
    free -= cost;
    budget -= m;
    (e.fed + m == e.traj.size() ? plan.sampled : plan.unsampled).push_back({&e, m});
  };
  // Decodes first: every episode with one token after its context (the budget holds them all,
  // as it is at least max_slots).
  auto decoding = [&](const Episode& e) { return e.fed > 0 && FeedLimit(e) - e.fed == 1; };
  for (Episode* e : ready) {
    if (!decoding(*e)) continue;
    const int64_t cost = backend_->FeedCost(e->slot, 1);
    if (cost > free) {
      wait(*e, cost);
    } else {
      add(*e, 1, cost);
    }
  }
  // Then prompts and tool results in chunks filling the rest of the budget, oldest first; after
  // one waits for context, later ones wait behind it (none overtakes it for the context freed).
  for (Episode* e : ready) {
    if (decoding(*e)) continue;
    if (budget == 0) break;
    const int64_t want = FeedLimit(*e) - e->fed;
    int64_t m = std::min(want, budget);
    int64_t cost = backend_->FeedCost(e->slot, m);
    if (cost > free) {
      // The longest chunk that fits (costs grow with the tokens).
      int64_t fits = 0, over = m;
      while (over - fits > 1) {
        const int64_t mid = fits + (over - fits) / 2;
        (backend_->FeedCost(e->slot, mid) <= free ? fits : over) = mid;
      }
      if (fits == 0) {
        wait(*e, cost);
        break;  // the later ones wait behind it
      }
      m = fits;
      cost = backend_->FeedCost(e->slot, m);
    }
    if (m < want) ++plan.chunked;
    add(*e, m, cost);
  }
  return plan;
}

Status AgentLoop::RunFeeds(const StepPlan& plan) {
  const double gen_start = NowMono();
  const int layers = backend_->moe_layers(), k = backend_->top_k();
  auto call_of = [](const std::vector<StepPlan::Item>& items, std::vector<int>* slots,
                    std::vector<std::vector<int32_t>>* feeds) {
    for (const StepPlan::Item& it : items) {
      const Episode& e = *it.episode;
      slots->push_back(e.slot);
      feeds->emplace_back(e.traj.tokens.begin() + e.fed, e.traj.tokens.begin() + e.fed + it.tokens);
    }
  };
  // Records the experts of an item's tokens (from `at` in the call's expert ids) and advances it.
  auto record = [&](const StepPlan::Item& it, const Tensor& experts, int64_t at) {
    Episode& e = *it.episode;
    const int64_t total = experts.defined() && layers > 0 ? experts.dim(1) : 0;
    for (int64_t p = 0; p < it.tokens && total > 0; ++p) {
      const int64_t pos = e.fed + p;
      if (pos < e.routed) continue;  // fed again after a preemption: the first routing stays
      for (int l = 0; l < layers; ++l) {
        const int32_t* src = experts.data<int32_t>() + (l * total + at + p) * k;
        uint16_t* dst = e.traj.routed_experts.data() + (pos * layers + l) * k;
        for (int j = 0; j < k; ++j) dst[j] = static_cast<uint16_t>(src[j]);
      }
    }
    stats_.tokens_fed += it.tokens;
    e.fed += it.tokens;
    e.routed = std::max(e.routed, e.fed);
  };
  if (!plan.unsampled.empty()) {
    std::vector<int> slots;
    std::vector<std::vector<int32_t>> feeds;
    call_of(plan.unsampled, &slots, &feeds);
    ORRERY_ASSIGN_OR_RETURN(FeedResult out, backend_->Feed(slots, feeds));
    int64_t at = 0;
    for (const StepPlan::Item& it : plan.unsampled) {
      record(it, out.expert_ids, at);
      at += it.tokens;
    }
  }
  if (!plan.sampled.empty()) {
    std::vector<int> slots;
    std::vector<std::vector<int32_t>> feeds;
    call_of(plan.sampled, &slots, &feeds);
    // Each episode's uniform number from its own stream: the backend draws with it (on the
    // device for the GPU backend), so the seed reproduces the episode either way.
    std::vector<SlotDraw> draws;
    draws.reserve(slots.size());
    for (const StepPlan::Item& it : plan.sampled) {
      draws.push_back({options_.sampling, it.episode->rng.Uniform()});
    }
    ORRERY_ASSIGN_OR_RETURN(SampledFeed out, backend_->FeedAndSample(slots, feeds, draws));
    if (out.tokens.size() != slots.size()) {
      return InternalError("agent loop: the backend drew " + std::to_string(out.tokens.size()) +
                           " tokens for " + std::to_string(slots.size()) + " slots");
    }
    int64_t at = 0;
    for (size_t i = 0; i < plan.sampled.size(); ++i) {
      const StepPlan::Item& it = plan.sampled[i];
      record(it, out.expert_ids, at);
      at += it.tokens;
      // The token drawn for it.
      Episode& e = *it.episode;
      Trajectory& t = e.traj;
      const SampledToken tok = out.tokens[i];
      AppendTokens(e, {tok.id}, TokenRole::kModel);
      t.logprobs.back() = tok.logprob;
      t.loss_mask.back() = 1;
      e.turn_ids.push_back(tok.id);
      ++stats_.tokens_generated;
    }
  }
  const double gen_seconds = NowMono() - gen_start;
  for (const auto* items : {&plan.unsampled, &plan.sampled}) {
    for (const StepPlan::Item& it : *items) it.episode->traj.generation_seconds += gen_seconds;
  }
  // Turn ends and limits (an episode that ends may be freed: each is touched last here).
  for (const StepPlan::Item& it : plan.sampled) {
    Episode& e = *it.episode;
    const int32_t last = e.turn_ids.back();
    if (last == format_->end_of_turn_id() || last == format_->end_of_text_id()) {
      ORRERY_RETURN_IF_ERROR(EndTurn(e, true));
    } else if (e.traj.size() >= options_.max_episode_tokens) {
      ++stats_.truncated_context;
      ORRERY_RETURN_IF_ERROR(EndTurn(e, false));
    } else if (static_cast<int>(e.turn_ids.size()) >= options_.max_turn_tokens) {
      ++stats_.truncated_turn_tokens;
      ORRERY_RETURN_IF_ERROR(EndTurn(e, false));
    }
  }
  return Status::OK();
}

bool AgentLoop::Preempt(const Episode& waiter) {
  Episode* victim = nullptr;
  for (const auto& e : slots_) {
    if (e == nullptr || e->seq <= waiter.seq || e->env_call != nullptr || e->fed == 0) continue;
    if (victim == nullptr || e->seq > victim->seq) victim = e.get();
  }
  if (victim == nullptr) return false;
  LeaveShare(*victim);
  backend_->Release(victim->slot);
  std::unique_ptr<Episode> owned = std::move(slots_[static_cast<size_t>(victim->slot)]);
  victim->slot = -1;
  victim->fed = 0;
  ++stats_.preemptions;
  queue_.push_front(std::move(owned));  // older than every queued episode
  return true;
}

StatusOr<std::vector<TrajectoryGroup>> AgentLoop::Step() {
  ++stats_.steps;
  if (options_.max_step_tokens > 0 && options_.max_step_tokens < backend_->max_slots()) {
    return InvalidArgumentError(
        "agent: max_step_tokens = " + std::to_string(options_.max_step_tokens) + " is below the " +
        std::to_string(backend_->max_slots()) +
        " slots (every decoding episode is fed each step): expected 0 or at least that");
  }
  // 1. Fill free slots (their Resets go to the env workers).
  Admit();
  // 2. Finished env calls; wait for one when nothing could be fed otherwise. 3. Shared prompts.
  auto feedable = [&] {
    for (const auto& e : slots_) {
      if (e != nullptr && Feedable(*e)) return true;
    }
    return false;
  };
  ORRERY_RETURN_IF_ERROR(ApplyEnvResults(0));
  ORRERY_RETURN_IF_ERROR(SharePrompts());
  if (!feedable() && stats_.env_calls_in_flight > 0) {
    ORRERY_RETURN_IF_ERROR(ApplyEnvResults(kEnvWaitMs));
    ORRERY_RETURN_IF_ERROR(SharePrompts());
  }
  // 4. The feed; when nothing fits the free context, preempt younger episodes until something
  // does.
  StepPlan plan = PlanFeeds();
  while (plan.empty() && plan.waiter != nullptr && Preempt(*plan.waiter)) plan = PlanFeeds();
  waiting_cost_ = plan.waiting_cost;
  stats_.context_waits += plan.waits;
  stats_.chunked_feeds += plan.chunked;
  if (plan.empty() && plan.waiter != nullptr) {
    if (stats_.env_calls_in_flight == 0) {
      const Episode& e = *plan.waiter;
      return ResourceExhaustedError(
          "agent loop: an episode of task " + e.traj.task_id + " holding " + std::to_string(e.fed) +
          " tokens cannot feed its next " + std::to_string(FeedLimit(e) - e.fed) +
          ": the backend has " + std::to_string(backend_->free_context()) + " of " +
          std::to_string(backend_->context_capacity()) +
          " context tokens free and no other episode holds any to give back (expected a pool "
          "that holds a whole episode of max_episode_tokens = " +
          std::to_string(options_.max_episode_tokens) +
          ": raise the pool, the GPU's page count, or lower max_episode_tokens)");
    }
    ORRERY_RETURN_IF_ERROR(ApplyEnvResults(kEnvWaitMs));  // a call that ends may free context
  }
  // 5-6. Feed, sample, turn ends.
  if (!plan.empty()) ORRERY_RETURN_IF_ERROR(RunFeeds(plan));
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
