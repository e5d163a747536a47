// The "learner" role (rl_roles.h): one data-parallel rank of the RL learner.
//
// Start: rank 0 picks the newest checkpoint in RUN/rl/checkpoints (or the initial policy) and
// writes a new start (learner_rendezvous.h); the other ranks restore the same checkpoint; all
// join a fresh communicator generation (learner_comm.h: [rl.learner] communicator, Gloo or NCCL,
// Gloo listening on the address the rank advertises; a single rank uses the local communicator).
// Each update: this rank's share of groups_per_step groups is taken from its BatchLog when the
// killed predecessor already sampled them, else sampled from the replay table (advancing the
// table's learner version, logged as this update's batch) and logged. The samples claim the
// groups for this rank ("learner/<rank>", a session per process) instead of deleting them; the
// claim is acknowledged (the store deletes the groups) only once the BatchLog holds them, and a
// restarted rank gets its predecessor's unacknowledged claims back first: a rank killed between a
// sample reply and BatchLog::Save loses no group. Then RlTrainer::Step; rank 0
// publishes the new version to RUN/rl/weights, announces it in the run state, writes metrics, and
// checkpoints every checkpoint_every versions. After the last version rank 0 sets the run phase
// to "rl-done" and every rank waits for the fleet to stop.
// [run] device = "cuda": the trainer trains the GPU model (model/gpu/gpu_model.h, in [run] dtype)
// uploaded from the initial policy on CUDA device rank % visible devices (on one GPU every rank
// and the rollouts share it); before each file publication its weights are copied into the host
// model, whose tensors WeightStore writes.
// [rl.rollout] weights = "learner": rank 0 also binds its endpoint and serves the published
// versions (WeightServer) on a thread of its own, for rollouts that do not share RUN.
// [rl.rollout] weights = "shared": rank 0 also copies every version into a buffer it shares with
// the rollouts of its host (model/shared_weights.h: CUDA IPC from the GPU model's masters, or
// shared memory from the host model) before it writes the file, and answers weights.Shared /
// weights.Release on that same thread (actors/rl/shared_weights_service.h).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "actors/metrics/metrics_publisher.h"
#include "actors/replay/client.h"
#include "actors/rl/batch_log.h"
#include "actors/rl/fleet_counts.h"
#include "actors/rl/learner_comm.h"
#include "actors/rl/learner_rendezvous.h"
#include "actors/rl/rl_config.h"
#include "actors/rl/rl_metrics.h"
#include "actors/rl/rl_roles.h"
#include "actors/rl/rl_run.h"
#include "actors/rl/shared_weights_service.h"
#include "actors/rl/trajectory_convert.h"
#include "actors/rl/weight_server.h"
#include "actors/runtime/actor.h"
#include "actors/runtime/role.h"
#include "core/device.h"
#include "core/file_io.h"
#include "core/logging.h"
#include "core/run_config.h"
#include "core/safetensors.h"
#include "learner/checkpoint.h"
#include "learner/policy_checkpoint.h"
#include "learner/rl/weight_store.h"
#include "model/shared_weights.h"
#include "rollout/model_backend.h"

namespace orrery::rl_actors {
namespace {

class LearnerRank {
 public:
  LearnerRank(ActorContext& ctx, RunConfig run, RlConfig config, PolicyCheckpoint policy, int world)
      : ctx_(ctx),
        run_(std::move(run)),
        config_(std::move(config)),
        policy_(std::move(policy)),
        rank_(ctx.index()),
        world_(world),
        paths_(ctx.run_dir()),
        weights_(paths_.weights, config_.keep_weights),
        batches_(ctx.state_dir() + "/batches"),
        claimant_("learner/" + std::to_string(rank_)),
        claim_session_(std::random_device{}() | (uint64_t{std::random_device{}()} << 32)) {}

  ~LearnerRank() {
    weight_stop_.Cancel();
    if (weight_thread_.joinable()) weight_thread_.join();
  }
  LearnerRank(const LearnerRank&) = delete;
  LearnerRank& operator=(const LearnerRank&) = delete;

  Status Run(const std::string& metrics_endpoint) {
    for (const char* name : {"model.toml", "tokenizer.json"}) {
      ORRERY_ASSIGN_OR_RETURN(checkpoint_files_[name], ReadFileToString(policy_.path + "/" + name));
    }
    ORRERY_RETURN_IF_ERROR(Start());
    if (rank_ == 0) {
      ORRERY_RETURN_IF_ERROR(ShareWeights());
      ORRERY_RETURN_IF_ERROR(ServeWeights());
      ORRERY_ASSIGN_OR_RETURN(
          metrics_, MetricsPublisher::Open(
                        {ActorMetricsFile(ctx_.run_dir(), "learner", 0), metrics_endpoint}));
      ORRERY_RETURN_IF_ERROR(Publish());
    }
    ORRERY_ASSIGN_OR_RETURN(std::string replay,
                            ctx_.fleet().Lookup("replay", std::chrono::seconds(60)));
    ORRERY_ASSIGN_OR_RETURN(replay_, replay::ReplayClient::Connect(replay, &ctx_.zmq()));
    ctx_.SetReady();
    ORRERY_LOG(INFO) << "rank " << rank_ << "/" << world_ << " at version " << trainer_->version()
                     << " of " << config_.steps << " (" << (config_.sync ? "sync" : "async") << ")";

    while (trainer_->version() < config_.steps && !ctx_.stop().cancelled()) {
      ctx_.Progress();
      const int64_t next = trainer_->version() + 1;
      StatusOr<std::vector<EncodedGroup>> batch = batches_.Load(next);
      if (!batch.ok()) {
        if (batch.status().code() != StatusCode::kNotFound) return batch.status();
        batch = Sample(next);
        if (!batch.ok()) return batch.status();
        if (ctx_.stop().cancelled()) break;
        ORRERY_RETURN_IF_ERROR(batches_.Save(next, *batch));
      } else {
        ORRERY_LOG(INFO) << "update " << next << ": re-using the " << batch->size()
                         << " logged groups";
      }
      // The batch is in the log: the store may delete the groups this rank claimed for it.
      ORRERY_RETURN_IF_ERROR(AcknowledgeClaims(next));
      std::vector<rl::PolicyGroup> groups;
      for (const EncodedGroup& g : *batch) {
        ORRERY_ASSIGN_OR_RETURN(rl::PolicyGroup pg, DecodeGroup(g.group_id, g.trajectories));
        groups.push_back(std::move(pg));
      }
      max_sample_tokens_ = 0;
      for (const rl::PolicyGroup& g : groups) {
        for (const rl::PolicySample& s : g.samples) {
          max_sample_tokens_ = std::max(max_sample_tokens_, static_cast<int64_t>(s.tokens.size()));
        }
      }
      const auto update_start = std::chrono::steady_clock::now();
      ORRERY_ASSIGN_OR_RETURN(rl::RlStepStats stats, trainer_->Step(groups));
      update_seconds_ =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - update_start).count();
      if (!stats.updated) {  // no rank had a usable token: the batch is spent, sample anew
        ORRERY_RETURN_IF_ERROR(batches_.DropThrough(next));
        continue;
      }
      tokens_total_ += stats.tokens;
      if (rank_ == 0) ORRERY_RETURN_IF_ERROR(AfterUpdate(stats));
      ORRERY_RETURN_IF_ERROR(DropCheckpointedBatches());
    }
    if (trainer_->version() >= config_.steps) {
      if (rank_ == 0) {
        ORRERY_RETURN_IF_ERROR(ctx_.fleet().SetRunState("rl-done", -1, trainer_->version()));
        ORRERY_LOG(INFO) << "reached version " << trainer_->version() << ": RL phase done";
      }
      while (!ctx_.stop().WaitFor(std::chrono::milliseconds(500))) {
        ctx_.Progress();  // done, idle until the fleet stops
      }
    }
    return Status::OK();
  }

 private:
  // Agrees on the checkpoint to resume from and builds the communicator and the trainer.
  Status Start() {
    LearnerStart start;
    const std::string last_path = ctx_.state_dir() + "/last_generation";
    if (rank_ == 0) {
      StatusOr<std::string> latest = LatestCheckpoint(paths_.checkpoints);
      if (!latest.ok() && latest.status().code() != StatusCode::kNotFound) return latest.status();
      ORRERY_ASSIGN_OR_RETURN(start, PublishLearnerStart(paths_.gloo, latest.ok() ? *latest : ""));
    } else {
      std::string last;
      if (StatusOr<std::string> text = ReadFileToString(last_path); text.ok()) last = *text;
      ORRERY_ASSIGN_OR_RETURN(
          start, AwaitLearnerStart(paths_.gloo, last, ctx_.stop(),
                                   std::chrono::milliseconds(config_.gloo_timeout_ms)));
      ORRERY_RETURN_IF_ERROR(WriteFileAtomic(last_path, start.generation));
    }
    LearnerCommOptions comm_options;
    comm_options.rank = rank_;
    comm_options.world_size = world_;
    comm_options.communicator = config_.communicator;
    comm_options.gloo_dir = paths_.gloo;
    comm_options.generation = start.generation;
    comm_options.timeout_ms = config_.gloo_timeout_ms;
    comm_options.endpoint = ctx_.endpoint();
    comm_options.allow_public_network = config_.gloo_public_network;
    ORRERY_ASSIGN_OR_RETURN(comm_, CreateLearnerCommunicator(comm_options));
    if (run_.device == RunDevice::kCuda) {
      const int devices = CudaDeviceCount();
      if (devices == 0) {
        return FailedPreconditionError(
            "run.device = \"cuda\": no CUDA device is visible to this process");
      }
      model::GpuModelOptions o;
      o.device = Device::Cuda(rank_ % devices);
      o.compute_dtype = run_.dtype;
      o.recompute_layers = config_.recompute_layers;
      StatusOr<std::unique_ptr<model::GpuModel>> g = model::GpuModel::FromHost(*policy_.model, o);
      if (!g.ok()) return g.status().WithContext("run.device = \"cuda\"");
      gpu_model_ = std::move(g).value();
      ORRERY_ASSIGN_OR_RETURN(
          trainer_, rl::RlTrainer::Create(gpu_model_.get(), comm_.get(), config_.trainer));
      ORRERY_LOG(INFO) << "training on " << o.device.ToString() << " in "
                       << DTypeName(o.compute_dtype)
                       << (o.recompute_layers ? ", recomputing each layer in the backward" : "");
    } else {
      ORRERY_ASSIGN_OR_RETURN(
          trainer_, rl::RlTrainer::Create(policy_.model.get(), comm_.get(), config_.trainer));
    }
    if (!start.checkpoint.empty()) {
      ORRERY_RETURN_IF_ERROR(trainer_->Restore(start.checkpoint));
      ORRERY_LOG(INFO) << "restored " << start.checkpoint;
    }
    return Status::OK();
  }

  // This rank's share of the update's groups, from the replay table. With skip_uniform_groups
  // (DAPO dynamic sampling) groups whose rewards are all equal carry no signal: they are counted
  // and replaced by further samples, so every update trains on a full batch.
  StatusOr<std::vector<EncodedGroup>> Sample(int64_t next) {
    const int n = config_.groups_per_step;
    const int share = n / world_ + (rank_ < n % world_ ? 1 : 0);
    std::vector<EncodedGroup> out;
    while (static_cast<int>(out.size()) < share && !ctx_.stop().cancelled()) {
      ctx_.Progress();  // each attempt waits at most 500 ms for groups: waiting is not a stall
      replay::SampleOptions o;
      o.max_items = share - static_cast<int>(out.size());
      o.learner_version = trainer_->version();
      o.batch_step = next;
      o.claimant = claimant_;
      o.claim_session = claim_session_;
      StatusOr<std::vector<replay::SampledItem>> items = replay_->Sample(config_.table, o, 500);
      if (!items.ok()) {
        if (items.status().code() == StatusCode::kDeadlineExceeded ||
            items.status().code() == StatusCode::kUnavailable) {
          continue;
        }
        // Cancelled: the store is stopping with the fleet; wait for this rank's own stop.
        if (items.status().code() == StatusCode::kCancelled) {
          ctx_.stop().WaitFor(std::chrono::milliseconds(200));
          continue;
        }
        return items.status().WithContext("replay sample");
      }
      for (const replay::SampledItem& item : *items) {
        EncodedGroup g;
        g.group_id = item.key;
        g.trajectories = *item.trajectories;
        if (config_.trainer.skip_uniform_groups) {
          ORRERY_ASSIGN_OR_RETURN(rl::PolicyGroup pg, DecodeGroup(g.group_id, g.trajectories));
          bool uniform = true;
          for (const rl::PolicySample& p : pg.samples) {
            uniform = uniform && p.reward == pg.samples.front().reward;
          }
          if (uniform) {
            ++uniform_skipped_;
            continue;
          }
        }
        out.push_back(std::move(g));
      }
    }
    return out;
  }

  // Retries while the store does not answer; a stopping store leaves the claims for the next
  // start, which acknowledges them after re-using the logged batch.
  Status AcknowledgeClaims(int64_t through_step) {
    while (!ctx_.stop().cancelled()) {
      ctx_.Progress();
      StatusOr<int64_t> deleted = replay_->Acknowledge(config_.table, claimant_, through_step);
      if (deleted.ok()) return Status::OK();
      const StatusCode code = deleted.status().code();
      if (code == StatusCode::kCancelled) return Status::OK();
      if (code != StatusCode::kUnavailable && code != StatusCode::kDeadlineExceeded) {
        return deleted.status().WithContext("replay acknowledge");
      }
    }
    return Status::OK();
  }

  // The tensors a version is made of: the GPU model's masters, or the host model's parameters.
  model::NamedTensors TrainedWeights() {
    return gpu_model_ != nullptr ? gpu_model_->NamedMasters()
                                 : rollout::NamedWeights(*policy_.model);
  }

  // weights = "shared": the two buffers versions alternate in, on the trained model's device.
  Status ShareWeights() {
    if (!config_.weights_shared) return Status::OK();
    const Device device = gpu_model_ != nullptr ? gpu_model_->device() : Device::Cpu();
    StatusOr<std::unique_ptr<model::SharedWeightPublisher>> p =
        model::SharedWeightPublisher::Create(TrainedWeights(), device);
    if (!p.ok()) return p.status().WithContext("rl.rollout.weights = \"shared\"");
    shared_ = std::move(p).value();
    ORRERY_LOG(INFO) << "sharing versions with the rollouts of this host: 2 buffers of "
                     << shared_->layout().total_bytes() << " bytes on " << device.ToString();
    return Status::OK();
  }

  // weights = "learner" or "shared": the published versions (files, and shared buffers), served
  // on ctx.endpoint() by a thread of its own until this rank's Run returns.
  Status ServeWeights() {
    if (!config_.weights_from_learner && !config_.weights_shared) return Status::OK();
    weight_server_ = std::make_unique<WeightServer>(paths_.weights);
    weight_actor_ = std::make_unique<Actor>(ctx_.zmq(), ctx_.name());
    ORRERY_RETURN_IF_ERROR(weight_actor_->Bind(ctx_.endpoint()));
    weight_server_->Register(*weight_actor_);
    RegisterSharedWeights(*weight_actor_, shared_.get());
    weight_thread_ = std::thread([this] {
      if (Status s = weight_actor_->Run(weight_stop_); !s.ok()) {
        ORRERY_LOG(ERROR) << "weight server: " << s.message();
      }
    });
    ORRERY_LOG(INFO) << "serving policy versions at " << weight_actor_->endpoint();
    return Status::OK();
  }

  // The new version to the rollouts: first into the shared buffer (weights = "shared": the
  // rollouts of this host take it from there), then as a file (other hosts, restarts, fallback).
  Status Publish() {
    const int64_t v = trainer_->version();
    if (shared_ != nullptr) {
      ORRERY_ASSIGN_OR_RETURN(sync_.shared_snapshot_seconds,
                              shared_->Publish(TrainedWeights(), v, UnixSeconds()));
    }
    // The GPU trainer's weights into the host model (nothing to do when it trains that model).
    const auto copy_start = std::chrono::steady_clock::now();
    ORRERY_RETURN_IF_ERROR(trainer_->CopyWeightsTo(policy_.model.get()));
    sync_.host_copy_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count();
    ORRERY_ASSIGN_OR_RETURN(rl::PublishTimings t,
                            weights_.Publish(rollout::NamedWeights(*policy_.model), v));
    sync_.snapshot_seconds = t.snapshot_seconds;
    sync_.write_seconds = t.write_seconds;
    return ctx_.fleet().SetRunState("rl", -1, v);
  }

  Status AfterUpdate(const rl::RlStepStats& stats) {
    ORRERY_RETURN_IF_ERROR(Publish());
    const int64_t v = trainer_->version();
    if (v % config_.checkpoint_every == 0 || v >= config_.steps) {
      ORRERY_ASSIGN_OR_RETURN(std::string dir,
                              trainer_->SaveCheckpoint(paths_.checkpoints, config_.keep_checkpoints,
                                                       checkpoint_files_));
      ORRERY_LOG(INFO) << "checkpoint " << dir;
    }
    MetricRecord r = LearnerRecord(ctx_.name(), stats, *policy_.model, tokens_total_,
                                   config_.trainer.max_staleness, sync_);
    r.scalars["learner/uniform_groups_skipped_total"] = static_cast<double>(uniform_skipped_);
    // The update's own time and rate (trainer Step: forward, backward, optimizer; not sampling or
    // publishing), the longest sequence it trained, and on the GPU the caching allocator's peak.
    r.scalars["learner/update_seconds"] = update_seconds_;
    if (update_seconds_ > 0) {
      r.scalars["learner/tokens_per_second"] = static_cast<double>(stats.tokens) / update_seconds_;
    }
    r.scalars["learner/max_sample_tokens"] = static_cast<double>(max_sample_tokens_);
    if (gpu_model_ != nullptr) {
      const CachingAllocatorStats mem = GetCachingAllocatorStats(gpu_model_->device().index);
      r.scalars["learner/device_peak_bytes"] = static_cast<double>(mem.peak_bytes_in_use);
      r.scalars["learner/device_reserved_bytes"] =
          static_cast<double>(mem.bytes_in_use + mem.bytes_cached);
    }
    AddReplayTableMetrics(r);
    ORRERY_LOG(INFO) << "version " << v << ": loss " << r.scalars["learner/loss"] << ", groups "
                     << stats.groups << " (" << uniform_skipped_
                     << " uniform ones skipped so far), grad norm " << stats.grad_norm;
    return metrics_->Publish(r);
  }

  // replay/table/* series (docs/dashboard.md) from the store's Info: size, stale evictions,
  // rate-limiter blocked time, and insert/sample rates over the interval since the previous
  // update. A store that does not answer only leaves them out of this record.
  void AddReplayTableMetrics(MetricRecord& r) {
    StatusOr<std::vector<replay::TableInfo>> tables = replay_->Info();
    if (!tables.ok()) return;
    const double now = UnixSeconds();
    for (const replay::TableInfo& t : *tables) {
      const std::string prefix = "replay/table/" + t.options.name + "/";
      r.scalars[prefix + "size_items"] = static_cast<double>(t.size);
      r.scalars[prefix + "stale_evicted_total"] = static_cast<double>(t.stale_evicted);
      r.scalars[prefix + "inserts_total"] = static_cast<double>(t.counters.inserts);
      r.scalars[prefix + "samples_total"] = static_cast<double>(t.counters.samples);
      // Seconds inserts and samples spent waiting on the table's rate limiter, cumulative.
      r.scalars[prefix + "blocked_seconds_total"] =
          t.insert_blocked.blocked_seconds_total + t.sample_blocked.blocked_seconds_total;
      auto previous = table_counters_.find(t.options.name);
      if (previous != table_counters_.end() && now > previous->second.time) {
        const double dt = now - previous->second.time;
        r.scalars[prefix + "inserts_per_second"] =
            static_cast<double>(t.counters.inserts - previous->second.inserts) / dt;
        r.scalars[prefix + "samples_per_second"] =
            static_cast<double>(t.counters.samples - previous->second.samples) / dt;
      }
      table_counters_[t.options.name] = {now, t.counters.inserts, t.counters.samples};
    }
  }

  // Batches of versions a checkpoint now covers are no longer needed.
  Status DropCheckpointedBatches() {
    StatusOr<std::string> latest = LatestCheckpoint(paths_.checkpoints);
    if (!latest.ok()) return Status::OK();
    long long v = -1;
    const std::string name = std::filesystem::path(*latest).filename().string();
    if (std::sscanf(name.c_str(), "step-%lld", &v) != 1) return Status::OK();
    return batches_.DropThrough(v);
  }

  ActorContext& ctx_;
  RunConfig run_;
  RlConfig config_;
  PolicyCheckpoint policy_;
  int rank_, world_;
  RlRunPaths paths_;
  rl::WeightStore weights_;
  // weights = "shared" (rank 0): the buffers the rollouts of this host copy versions from (the
  // server thread that answers for it is joined in the destructor's body, before it goes).
  std::unique_ptr<model::SharedWeightPublisher> shared_;
  // weights = "learner" or "shared" (rank 0): the server, its mailbox and loop thread; the stop
  // is cancelled and the thread joined before the mailbox goes.
  std::unique_ptr<WeightServer> weight_server_;
  std::unique_ptr<Actor> weight_actor_;
  Cancellation weight_stop_;
  std::thread weight_thread_;
  BatchLog batches_;
  const std::string claimant_;
  const uint64_t claim_session_;
  std::map<std::string, std::string> checkpoint_files_;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<model::GpuModel> gpu_model_;  // run.device = "cuda"
  std::unique_ptr<rl::RlTrainer> trainer_;
  std::unique_ptr<replay::ReplayClient> replay_;
  std::unique_ptr<MetricsPublisher> metrics_;
  WeightSyncTimes sync_;
  int64_t tokens_total_ = 0;
  double update_seconds_ = 0;      // the last trainer Step
  int64_t max_sample_tokens_ = 0;  // the longest sample of the last update's batch
  int64_t uniform_skipped_ = 0;
  struct TableCounters {
    double time = 0;
    int64_t inserts = 0, samples = 0;
  };
  std::map<std::string, TableCounters> table_counters_;
};

}  // namespace

Status LearnerMain(ActorContext& ctx) {
  ConfigTable root = ctx.config_root();
  const RunConfig run = ReadRunConfig(root);
  ORRERY_ASSIGN_OR_RETURN(RlConfig config,
                          ResolveRlConfig(ReadRlConfig(root), RlRunPaths(ctx.run_dir())));
  ORRERY_ASSIGN_OR_RETURN(PolicyCheckpoint policy, LoadPolicyCheckpoint(config.init));
  const int world = FleetRoleCount(root, "learner");
  const std::string metrics_endpoint = root.Table("fleet").String("metrics_endpoint", "");
  LearnerRank rank(ctx, run, std::move(config), std::move(policy), world);
  return rank.Run(metrics_endpoint);
}

}  // namespace orrery::rl_actors
