// The "rollout" role (rl_roles.h): an agent loop on the newest published policy, feeding the
// replay store.
//
// Tasks: instance i of N takes train-split task indices i, i + N, i + 2N, ... Its cursor
// (task_cursor.h) is kept in its state directory, so a restarted instance re-issues exactly the
// groups that were in flight when it died, and drops a group that keeps ending it.
// Environment calls run off the decode loop (AgentLoop, one env worker per slot), on this
// process's environment or, with [rl.rollout] env = "remote", on env servers (RemoteEnv).
// Weights: every weight_poll_ms it looks for a newer version in RUN/rl/weights (or, with
// [rl.rollout] weights = "learner", in its own state directory, which a WeightFollower thread keeps
// at the newest version learner rank 0 serves over the fleet's transport) and applies it
// between engine steps (episodes in flight continue: partial rollouts). The backend is the one
// [run] device asks for (rollout/make_backend.h): the host model, or the GPU engine on CUDA device
// 0 (shared with the learner on one GPU), which takes the named tensors into its masters in
// place. With [rl.rollout] weights = "shared", PollWeights first asks learner rank 0 for a newer
// version in its shared buffer (actors/rl/shared_weights_service.h) and copies it straight into
// the backend's weights (device to device on the GPU), timed as transfer and apply; the files are
// the fallback (another host, a learner that is restarting, a copy that was not whole).
// Async mode keeps every slot busy; sync mode generates this instance's share of one update's
// groups with version v, then waits for version v + 1.
#include <chrono>
#include <filesystem>
#include <thread>

#include "actors/envserver/remote_env.h"
#include "actors/metrics/metrics_publisher.h"
#include "actors/replay/client.h"
#include "actors/rl/fleet_counts.h"
#include "actors/rl/rl_config.h"
#include "actors/rl/rl_metrics.h"
#include "actors/rl/rl_roles.h"
#include "actors/rl/rl_run.h"
#include "actors/rl/shared_weights_service.h"
#include "actors/rl/task_cursor.h"
#include "actors/rl/trajectory_convert.h"
#include "actors/rl/weight_follower.h"
#include "actors/runtime/role.h"
#include "core/device.h"
#include "core/logging.h"
#include "core/message_limits.h"
#include "core/run_config.h"
#include "core/safetensors.h"
#include "env/registry.h"
#include "learner/policy_checkpoint.h"
#include "learner/rl/weight_store.h"
#include "rollout/make_backend.h"

namespace orrery::rl_actors {
namespace {

class RolloutActor {
 public:
  RolloutActor(ActorContext& ctx, RunConfig run, RlConfig config, std::unique_ptr<env::Env> env,
               PolicyCheckpoint policy, int count)
      : ctx_(ctx),
        run_(std::move(run)),
        config_(std::move(config)),
        env_(std::move(env)),
        policy_(std::move(policy)),
        count_(count),
        paths_(ctx.run_dir()),
        weights_(config_.weights_from_learner ? ctx.state_dir() + "/weights" : paths_.weights,
                 config_.keep_weights),
        cursor_(ctx.state_dir() + "/task_cursor", ctx.index(), count) {}

  Status Run(const std::string& metrics_endpoint, uint64_t seed) {
    ORRERY_RETURN_IF_ERROR(cursor_.Load());
    StatusOr<std::unique_ptr<rollout::PolicyBackend>> backend =
        rollout::MakePolicyBackend(policy_.model.get(), run_.device, run_.dtype, config_.slots,
                                   config_.agent.max_episode_tokens);
    if (!backend.ok()) {
      return run_.device == RunDevice::kCuda ? backend.status().WithContext("run.device = \"cuda\"")
                                             : backend.status();
    }
    backend_ = std::move(backend).value();
    rollout::AgentOptions agent = config_.agent;
    agent.seed = seed;
    loop_ = std::make_unique<rollout::AgentLoop>(backend_.get(), policy_.format.get(), env_.get(),
                                                 agent);
    // The publisher first: the first version's fetch and load are reported too.
    ORRERY_ASSIGN_OR_RETURN(
        metrics_, MetricsPublisher::Open({ActorMetricsFile(ctx_.run_dir(), "rollout", ctx_.index()),
                                          metrics_endpoint}));
    ORRERY_RETURN_IF_ERROR(FollowLearner());
    ORRERY_RETURN_IF_ERROR(ShareWithLearner());
    ORRERY_RETURN_IF_ERROR(PollWeights());
    ORRERY_ASSIGN_OR_RETURN(std::string replay,
                            ctx_.fleet().Lookup("replay", std::chrono::seconds(60)));
    ORRERY_ASSIGN_OR_RETURN(replay_, replay::ReplayClient::Connect(replay, &ctx_.zmq()));
    ctx_.SetReady();
    ORRERY_LOG(INFO) << "policy version " << loop_->version() << ", task cursor "
                     << cursor_.committed() << ", " << (config_.sync ? "sync" : "async")
                     << " mode, " << config_.slots << " slots";

    auto last_poll = std::chrono::steady_clock::now();
    while (!ctx_.stop().cancelled()) {
      ctx_.Progress();  // idle iterations too: a rollout past the learner's last version
      const auto now = std::chrono::steady_clock::now();
      if (now - last_poll >= std::chrono::milliseconds(config_.weight_poll_ms)) {
        ORRERY_RETURN_IF_ERROR(PollWeights());
        last_poll = now;
      }
      if (loop_->version() >= config_.steps) {  // the learner is done: nothing left to feed
        ctx_.stop().WaitFor(std::chrono::milliseconds(200));
        continue;
      }
      ORRERY_RETURN_IF_ERROR(Refill());
      if (loop_->idle()) {
        ctx_.stop().WaitFor(std::chrono::milliseconds(config_.sync ? 20 : 50));
        continue;
      }
      const auto step_start = std::chrono::steady_clock::now();
      const int64_t generated_before = loop_->stats().tokens_generated;
      const int64_t fed_before = loop_->stats().tokens_fed;
      ORRERY_ASSIGN_OR_RETURN(std::vector<rollout::TrajectoryGroup> done, loop_->Step());
      generation_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      generated_tokens_ += loop_->stats().tokens_generated - generated_before;
      fed_tokens_ += loop_->stats().tokens_fed - fed_before;
      for (const rollout::TrajectoryGroup& g : done) ORRERY_RETURN_IF_ERROR(Insert(g));
      if (!done.empty()) Report(done);
    }
    if (follower_ != nullptr) PublishFetches();  // fetches since the last poll
    return Status::OK();
  }

 private:
  int Share() const {
    const int n = config_.groups_per_step;
    return n / count_ + (ctx_.index() < n % count_ ? 1 : 0);
  }

  // Queues new groups: enough to keep every slot busy (async), or this instance's share of the
  // current version's update (sync).
  Status Refill() {
    if (config_.sync) {
      if (sync_version_ != loop_->version()) {
        sync_version_ = loop_->version();
        sync_issued_ = 0;
      }
      while (sync_issued_ < Share()) {
        ORRERY_RETURN_IF_ERROR(AddGroup());
        ++sync_issued_;
      }
      return Status::OK();
    }
    while (loop_->active_episodes() + loop_->queued_episodes() < config_.slots) {
      ORRERY_RETURN_IF_ERROR(AddGroup());
    }
    return Status::OK();
  }

  // An environment that cannot give the next train task ends the actor with its error.
  Status AddGroup() {
    ORRERY_ASSIGN_OR_RETURN(const uint64_t task_index, cursor_.Issue());
    StatusOr<env::TaskRef> task = env_->Task(env::Split::kTrain, task_index);
    if (!task.ok()) {
      return task.status().WithContext(env_->name() + " train task " + std::to_string(task_index));
    }
    loop_->AddGroup(*task, task_index, config_.group_size);
    return Status::OK();
  }

  // weights = "learner": the thread that copies versions from learner rank 0 into weights_.
  Status FollowLearner() {
    if (!config_.weights_from_learner) return Status::OK();
    ORRERY_ASSIGN_OR_RETURN(std::string learner,
                            ctx_.fleet().Lookup("learner:0", std::chrono::seconds(120)));
    WeightFetchOptions o;
    o.dir = weights_.dir();
    o.keep = config_.keep_weights;
    // A chunk must fit in one message of the fleet (max_message_mb), with room for its envelope.
    o.chunk_bytes = std::min<int64_t>(config_.weight_chunk_mb << 20, MaxMessageBytes() / 2);
    follower_ = std::make_unique<WeightFollower>(ctx_.zmq(), ctx_.name() + "/weights", o, learner,
                                                 std::chrono::milliseconds(config_.weight_poll_ms));
    ORRERY_LOG(INFO) << "weights: following learner:0 at " << learner << " into " << o.dir;
    ORRERY_RETURN_IF_ERROR(follower_->Start());
    // Start on the learner's current version (it published one before it became ready), not on
    // the initial policy, whose groups would be stale after a learner resumed from a checkpoint.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (follower_->rounds() == 0 && std::chrono::steady_clock::now() < give_up &&
           !ctx_.stop().WaitFor(std::chrono::milliseconds(20))) {
      ctx_.Progress();
    }
    return follower_->status();
  }

  // weights = "shared": the client of learner rank 0's shared buffers.
  Status ShareWithLearner() {
    if (!config_.weights_shared) return Status::OK();
    ORRERY_ASSIGN_OR_RETURN(std::string learner,
                            ctx_.fleet().Lookup("learner:0", std::chrono::seconds(120)));
    StatusOr<model::NamedTensors> targets = backend_->WeightTargets();
    if (!targets.ok()) {
      ORRERY_LOG(WARN) << "weights: " << targets.status().message() << "; reading the files";
      return Status::OK();
    }
    shared_targets_ = std::move(targets).value();  // views of the backend's own storage
    shared_ = std::make_unique<SharedWeightClient>(ctx_.zmq(), ctx_.name() + "/shared-weights");
    ORRERY_RETURN_IF_ERROR(shared_->Connect(learner));
    ORRERY_LOG(INFO) << "weights: from learner:0's shared buffers at " << learner << " (files in "
                     << weights_.dir() << " as the fallback)";
    return Status::OK();
  }

  // A newer version from the learner's shared buffer, straight into the backend's weights: true
  // when one was applied. Only an error that ends the actor is returned; the others leave the
  // files to this poll (and a copy that was not whole makes the file path reload).
  StatusOr<bool> PollShared() {
    const auto now = std::chrono::steady_clock::now();
    if (now < shared_retry_at_) return false;
    StatusOr<SharedUpdate> got = shared_->Fetch(loop_->version(), shared_targets_);
    if (!got.ok()) {
      const StatusCode code = got.status().code();
      if (code == StatusCode::kDataLoss) {
        reload_ = true;  // the backend's weights are a mix: the file path loads a whole version
        ORRERY_LOG(WARN) << got.status().message() << "; reloading from the files";
      } else if (code == StatusCode::kFailedPrecondition) {
        ORRERY_LOG(WARN) << got.status().message() << "; reading versions from " << weights_.dir();
        shared_.reset();
      } else {
        // The learner starting or restarting: the files meanwhile, asked again in a few seconds.
        if (now - shared_warned_at_ >= std::chrono::minutes(1)) {
          ORRERY_LOG(WARN) << "weights: " << got.status().message() << "; reading the files";
          shared_warned_at_ = now;
        }
        shared_retry_at_ = now + std::chrono::seconds(5);
      }
      return false;
    }
    if (got->version < 0) return false;
    const auto apply_start = std::chrono::steady_clock::now();
    ORRERY_RETURN_IF_ERROR(backend_->WeightsWritten(got->version));
    const double apply =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - apply_start).count();
    reload_ = false;
    MetricRecord r;
    r.time = UnixSeconds();
    r.source = ctx_.name();
    r.step = got->version;
    r.scalars["rollout/weight_sync_seconds/phase/transfer"] = got->transfer_seconds;
    r.scalars["rollout/weight_sync_seconds/phase/apply"] = apply;
    r.scalars["rollout/weight_live_seconds"] = r.time - got->published_at;
    r.scalars["rollout/weight_shared_bytes"] = static_cast<double>(got->bytes);
    if (metrics_) (void)metrics_->Publish(r);
    return true;
  }

  Status PollWeights() {
    if (follower_ != nullptr) {
      ORRERY_RETURN_IF_ERROR(follower_->status());
      PublishFetches();
    }
    if (shared_ != nullptr) {
      ORRERY_ASSIGN_OR_RETURN(const bool took, PollShared());
      if (took) return Status::OK();
    }
    StatusOr<int64_t> latest = weights_.Latest();
    if (!latest.ok()) {
      if (latest.status().code() == StatusCode::kNotFound && !reload_) return Status::OK();
      return reload_ ? latest.status().WithContext("weights: the shared copy was not whole")
                     : latest.status();
    }
    if (*latest <= loop_->version() && !reload_) return Status::OK();
    rl::LoadTimings timings;
    StatusOr<std::vector<std::pair<std::string, Tensor>>> named = weights_.Load(*latest, &timings);
    if (!named.ok()) {
      // Deleted between Latest and Load (the learner keeps only the newest few): next poll.
      if (named.status().code() == StatusCode::kNotFound) return Status::OK();
      return named.status();
    }
    ORRERY_RETURN_IF_ERROR(loop_->UpdateWeights(*named, *latest));
    reload_ = false;
    MetricRecord r;
    r.time = UnixSeconds();
    r.source = ctx_.name();
    r.step = *latest;
    r.scalars["rollout/weight_load_seconds"] = timings.read_seconds;
    if (metrics_) (void)metrics_->Publish(r);
    return Status::OK();
  }

  // One record per version the follower fetched from the learner (step: that version), whether
  // or not the rollout loads that version (it may already be past it).
  void PublishFetches() {
    for (const FetchStats& f : follower_->TakeFetched()) {
      MetricRecord r;
      r.time = UnixSeconds();
      r.source = ctx_.name();
      r.step = f.version;
      r.scalars["rollout/weight_fetch_seconds"] = f.seconds;
      r.scalars["rollout/weight_fetch_bytes"] = static_cast<double>(f.bytes_fetched);
      r.scalars["rollout/weight_fetch_chunk_retries"] = static_cast<double>(f.chunk_retries);
      if (metrics_) (void)metrics_->Publish(r);
    }
  }

  // Inserts one finished group, retrying while the store applies back-pressure or does not
  // answer; acknowledges the task only once the store acknowledged the group. The idempotency key
  // is the group id (the task index, unique in the run), so a retry after a store that committed
  // but crashed before replying, or a group re-issued by a restarted instance, is stored once.
  Status Insert(const rollout::TrajectoryGroup& g) {
    replay::ItemInput item;
    item.group_id = g.group_id;
    item.idempotency_key = "group/" + std::to_string(g.group_id);
    int64_t min_version = INT64_MAX;
    for (const rollout::Trajectory& t : g.trajectories) {
      item.trajectories.push_back(replay::EncodeTrajectory(ToReplayTrajectory(t)));
      item.tokens += t.size();
      min_version = std::min(min_version, t.min_policy_version());
    }
    item.min_policy_version = g.trajectories.empty() ? 0 : min_version;
    while (!ctx_.stop().cancelled()) {
      ctx_.Progress();  // each attempt is bounded (500 ms): back-pressure is not a stall
      StatusOr<replay::InsertReply> reply = replay_->Insert(config_.table, item, 500);
      if (reply.ok()) {
        if (reply->dropped_stale) ++stale_dropped_;
        return cursor_.Acknowledge(g.group_id);
      }
      // Cancelled: the store is stopping with the fleet; this actor's stop follows.
      if (reply.status().code() == StatusCode::kCancelled) break;
      if (reply.status().code() != StatusCode::kDeadlineExceeded &&
          reply.status().code() != StatusCode::kUnavailable) {
        return reply.status().WithContext("replay insert");
      }
    }
    return Status::OK();  // stopping: the group is re-issued by the next start
  }

  void Report(const std::vector<rollout::TrajectoryGroup>& groups) {
    MetricRecord r = RolloutRecord(ctx_.name(), loop_->version(), groups, generated_tokens_,
                                   generation_seconds_);
    r.scalars["rollout/groups_total"] = static_cast<double>(loop_->stats().groups_finished);
    r.scalars["rollout/stale_dropped_total"] = static_cast<double>(stale_dropped_);
    const rollout::AgentStats& st = loop_->stats();
    r.scalars["rollout/format_errors_total"] = static_cast<double>(st.format_errors);
    r.scalars["rollout/env_tool_errors_total"] = static_cast<double>(st.env_tool_errors);
    r.scalars["rollout/env_timeouts_total"] = static_cast<double>(st.env_timeouts);
    r.scalars["rollout/env_lost_total"] = static_cast<double>(st.env_lost);
    r.scalars["rollout/groups_dropped_total"] = static_cast<double>(cursor_.dropped());
    // Truncated episodes since start, by the limit that ended them (rollout/agent_loop.h): the
    // context (max_episode_tokens) is the one a long-context run must never hit.
    r.scalars["rollout/truncated_context_total"] = static_cast<double>(st.truncated_context);
    r.scalars["rollout/truncated_turn_tokens_total"] =
        static_cast<double>(st.truncated_turn_tokens);
    r.scalars["rollout/truncated_turns_total"] = static_cast<double>(st.truncated_turns);
    // Every token the engine fed (prompt and tool chunks, decodes) per second of engine steps:
    // with long prompts the rate that matters, beside generation_tokens_per_second.
    if (generation_seconds_ > 0) {
      r.scalars["rollout/fed_tokens_per_second"] =
          static_cast<double>(fed_tokens_) / generation_seconds_;
    }
    if (run_.device == RunDevice::kCuda) {
      const CachingAllocatorStats mem = GetCachingAllocatorStats(0);  // the backend's device
      r.scalars["rollout/device_peak_bytes"] = static_cast<double>(mem.peak_bytes_in_use);
      r.scalars["rollout/device_reserved_bytes"] =
          static_cast<double>(mem.bytes_in_use + mem.bytes_cached);
    }
    generated_tokens_ = 0;
    fed_tokens_ = 0;
    generation_seconds_ = 0;
    if (Status s = metrics_->Publish(r); !s.ok()) ORRERY_LOG(WARN) << s.message();
  }

  ActorContext& ctx_;
  RunConfig run_;
  RlConfig config_;
  std::unique_ptr<env::Env> env_;
  PolicyCheckpoint policy_;
  int count_;
  RlRunPaths paths_;
  rl::WeightStore weights_;
  TaskCursor cursor_;
  std::unique_ptr<rollout::PolicyBackend> backend_;
  std::unique_ptr<rollout::AgentLoop> loop_;
  std::unique_ptr<replay::ReplayClient> replay_;
  std::unique_ptr<MetricsPublisher> metrics_;
  std::unique_ptr<WeightFollower> follower_;
  std::unique_ptr<SharedWeightClient> shared_;  // weights = "shared", until it cannot be used
  model::NamedTensors shared_targets_;          // the backend's weights, written in place
  std::chrono::steady_clock::time_point shared_retry_at_, shared_warned_at_;
  bool reload_ = false;  // the backend's weights are not one whole version: load the newest file
  int64_t sync_version_ = -1;
  int sync_issued_ = 0;
  int64_t stale_dropped_ = 0;
  int64_t generated_tokens_ = 0;
  double generation_seconds_ = 0;
  int64_t fed_tokens_ = 0;
};

// The environment of [env], in this process or (env = "remote") on env servers: the configured
// endpoints, else every instance of the fleet's "env" role.
StatusOr<std::unique_ptr<env::Env>> RolloutEnv(ActorContext& ctx, ConfigTable& root,
                                               const RlConfig& config) {
  if (!config.remote_env) {
    env::EnvRegistry registry;
    env::RegisterBuiltinEnvs(registry);
    return env::CreateEnvFromConfig(root, registry, RolloutEnvDemand(config));
  }
  envserver::RemoteEnvOptions remote;
  remote.env = root.Table("env").String("name", "calc");
  remote.endpoints = config.env_endpoints;
  if (remote.endpoints.empty()) {
    const int servers = FleetRoleCount(root, "env");
    for (int i = 0; i < servers; ++i) {
      ORRERY_ASSIGN_OR_RETURN(std::string endpoint, ctx.fleet().Lookup("env:" + std::to_string(i),
                                                                       std::chrono::seconds(60)));
      remote.endpoints.push_back(endpoint);
    }
  }
  std::string list;
  for (const std::string& e : remote.endpoints) list += (list.empty() ? "" : ", ") + e;
  ORRERY_LOG(INFO) << "environment '" << remote.env << "' on env servers " << list;
  return envserver::CreateRemoteEnv(ctx.zmq(), ctx.name(), remote);
}

}  // namespace

Status RolloutMain(ActorContext& ctx) {
  ConfigTable root = ctx.config_root();
  const RunConfig run = ReadRunConfig(root);
  ORRERY_ASSIGN_OR_RETURN(RlConfig config,
                          ResolveRlConfig(ReadRlConfig(root), RlRunPaths(ctx.run_dir())));
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<env::Env> env, RolloutEnv(ctx, root, config));
  ORRERY_ASSIGN_OR_RETURN(PolicyCheckpoint policy, LoadPolicyCheckpoint(config.init));
  const int count = FleetRoleCount(root, "rollout");
  const std::string metrics_endpoint = root.Table("fleet").String("metrics_endpoint", "");
  // Distinct sampling streams per instance; the same after a restart (re-issued groups repeat).
  const uint64_t seed = run.seed * 1000003ull + static_cast<uint64_t>(ctx.index()) + 1;
  RolloutActor actor(ctx, run, std::move(config), std::move(env), std::move(policy), count);
  return actor.Run(metrics_endpoint, seed);
}

}  // namespace orrery::rl_actors
