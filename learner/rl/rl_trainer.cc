#include "learner/rl/rl_trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "learner/checkpoint.h"

namespace orrery::rl {
namespace {

std::string BiasName(const model::ModelConfig& c, size_t moe_index) {
  return "layers." + std::to_string(c.first_k_dense + static_cast<int64_t>(moe_index)) +
         ".moe.balancing_bias";
}

// Averages the gradients over ranks: in place on the CPU, through host copies on a device (the
// Communicator takes host spans).
Status AllReduceGradients(comm::Communicator& comm, const std::vector<ParamRef>& params) {
  if (comm.world_size() == 1) return Status::OK();
  std::vector<Tensor> grads;
  bool host = true;
  for (const ParamRef& p : params) host = host && p.grad.device().is_cpu();
  for (const ParamRef& p : params) {
    if (host) {
      grads.push_back(p.grad);
    } else {
      ORRERY_ASSIGN_OR_RETURN(Tensor h, p.grad.To(Device::Cpu()));
      grads.push_back(std::move(h));
    }
  }
  ORRERY_RETURN_IF_ERROR(comm::AllReduceMean(comm, grads));
  if (host) return Status::OK();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad;
    ORRERY_RETURN_IF_ERROR(g.CopyFrom(grads[i]));
  }
  return Status::OK();
}

// One packed micro-batch: samples as documents of one row, with the per-token loss inputs (all
// but π_prox, which is filled in before the first optimizer step that uses it).
struct MicroBatch {
  std::vector<const PolicySample*> samples;
  std::vector<double> advantages;
  int64_t tokens = 0;
  PolicyBatch batch;  // tokens, cu_seqlens, forced_experts ([layers, tokens, k] under R3)
  PolicyLossInput in;
};

// Fills mb's columns from its samples.
void Pack(MicroBatch& mb, int layers, int k, bool forced) {
  const int64_t n = mb.tokens;
  std::vector<int64_t>& cu = mb.batch.cu_seqlens;
  cu = {0};
  if (forced) mb.batch.forced_experts = Tensor::Empty({layers, n, k}, DType::kI32);
  for (size_t i = 0; i < mb.samples.size(); ++i) {
    const PolicySample& s = *mb.samples[i];
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    const int64_t base = cu.back();
    mb.batch.tokens.insert(mb.batch.tokens.end(), s.tokens.begin(), s.tokens.end());
    cu.push_back(base + len);
    for (int64_t t = 0; t < len; ++t) {
      const bool target = t + 1 < len;
      mb.in.targets.push_back(target ? s.tokens[t + 1] : -1);
      mb.in.mask.push_back(target ? s.loss_mask[t + 1] : 0);
      mb.in.behaviour_logprobs.push_back(target ? s.behaviour_logprobs[t + 1] : 0.0f);
      mb.in.advantages.push_back(static_cast<float>(mb.advantages[i]));
      mb.in.sequence_ids.push_back(static_cast<int32_t>(i));
      if (forced) {
        for (int l = 0; l < layers; ++l) {
          for (int j = 0; j < k; ++j) {
            mb.batch.forced_experts.data<int32_t>()[(l * n + base + t) * k + j] =
                s.routed_experts[(t * layers + l) * k + j];
          }
        }
      }
    }
  }
}

// Routing agreement of one pass: for each position whose routing was recorded (all but each
// sample's last), how many of the recorded experts the learner's router (scores + current biases)
// would also pick; added into agree and compared per MoE layer.
void AddRoutingAgreement(const MicroBatch& mb, const std::vector<Tensor>& scores,
                         const std::vector<Tensor>& biases, int64_t e, int k,
                         std::vector<double>* agree, std::vector<double>* compared) {
  const int64_t n = mb.tokens;
  const std::vector<int64_t>& cu = mb.batch.cu_seqlens;
  std::vector<std::pair<float, int>> order(e);
  for (size_t l = 0; l < scores.size(); ++l) {
    const float* s = scores[l].data<float>();
    const float* bias = biases[l].data<float>();
    for (size_t i = 0; i + 1 < cu.size(); ++i) {
      for (int64_t p = cu[i]; p + 1 < cu[i + 1]; ++p) {
        for (int64_t x = 0; x < e; ++x) order[x] = {-(s[p * e + x] + bias[x]), int(x)};
        std::partial_sort(order.begin(), order.begin() + k, order.end());
        for (int j = 0; j < k; ++j) {
          const int32_t want = mb.batch.forced_experts.data<int32_t>()[(l * n + p) * k + j];
          for (int q = 0; q < k; ++q) (*agree)[l] += order[q].second == want;
        }
        (*compared)[l] += k;
      }
    }
  }
}

}  // namespace

int64_t PolicySample::min_policy_version() const {
  int64_t v = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (loss_mask[i]) v = std::min(v, policy_versions[i]);
  }
  return v == std::numeric_limits<int64_t>::max() ? 0 : v;
}

Status ValidateRlTrainerOptions(const RlTrainerOptions& o) {
  ORRERY_RETURN_IF_ERROR(ValidatePolicyLossOptions(o.loss));
  if (!(o.lr > 0)) return InvalidArgumentError("rl: lr must be > 0");
  if (!(o.temperature > 0)) return InvalidArgumentError("rl: temperature must be > 0");
  if (o.micro_batch_tokens < 2) return InvalidArgumentError("rl: micro_batch_tokens must be >= 2");
  if (o.ppo_epochs < 1) return InvalidArgumentError("rl: ppo_epochs must be >= 1");
  if (o.minibatches < 1) return InvalidArgumentError("rl: minibatches must be >= 1");
  return Status::OK();
}

RlTrainer::RlTrainer(std::unique_ptr<PolicyModel> model, comm::Communicator* comm,
                     RlTrainerOptions options, std::unique_ptr<AdamW> adamw)
    : model_(std::move(model)), comm_(comm), options_(options), adamw_(std::move(adamw)) {}

StatusOr<std::unique_ptr<RlTrainer>> RlTrainer::Create(std::unique_ptr<PolicyModel> model,
                                                       comm::Communicator* comm,
                                                       RlTrainerOptions options) {
  ORRERY_RETURN_IF_ERROR(ValidateRlTrainerOptions(options));
  ORRERY_ASSIGN_OR_RETURN(AdamW adamw, AdamW::Create(options.adamw, model->Parameters()));
  return std::unique_ptr<RlTrainer>(
      new RlTrainer(std::move(model), comm, options, std::make_unique<AdamW>(std::move(adamw))));
}

StatusOr<std::unique_ptr<RlTrainer>> RlTrainer::Create(model::Model* model,
                                                       comm::Communicator* comm,
                                                       RlTrainerOptions options) {
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<PolicyModel> m, HostPolicyModel(model));
  return Create(std::move(m), comm, options);
}

StatusOr<std::unique_ptr<RlTrainer>> RlTrainer::Create(model::GpuModel* model,
                                                       comm::Communicator* comm,
                                                       RlTrainerOptions options) {
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<PolicyModel> m, GpuPolicyModel(model));
  return Create(std::move(m), comm, options);
}

StatusOr<RlStepStats> RlTrainer::Step(const std::vector<PolicyGroup>& groups) {
  const model::ModelConfig& cfg = model_->config();
  const int layers = static_cast<int>(cfg.num_moe_layers());
  const int k = static_cast<int>(cfg.moe.top_k);
  const bool forced = options_.routing_replay && layers > 0;  // every sample has its routing
  RlStepStats stats;
  stats.routing_agreement.assign(layers, 1.0);
  std::vector<double> agree(layers, 0.0), compared(layers, 0.0);

  // 1-2. Staleness window, environment faults, advantages.
  std::vector<std::pair<const PolicySample*, double>> used;
  for (const PolicyGroup& g : groups) {
    ++stats.groups;
    std::vector<const PolicySample*> fresh;
    for (const PolicySample& s : g.samples) {
      const size_t n = s.tokens.size();
      if (s.behaviour_logprobs.size() != n || s.policy_versions.size() != n ||
          s.loss_mask.size() != n ||
          (!s.routed_experts.empty() && s.routed_experts.size() != n * layers * k)) {
        return InvalidArgumentError("rl: a sample of group " + std::to_string(g.group_id) +
                                    " has per-token columns of different lengths");
      }
      // The environment ended it, not the policy: its reward says nothing (masked, not 0).
      if (s.env_fault) {
        ++stats.env_fault_dropped;
        continue;
      }
      if (n < 2) continue;
      if (options_.max_staleness >= 0 &&
          version_ - s.min_policy_version() > options_.max_staleness) {
        ++stats.stale_dropped;
        continue;
      }
      // R3 never falls back silently: a sample without its rollout's routing would be trained
      // under routing the rollout never used (and would unforce its whole micro-batch).
      if (options_.routing_replay && layers > 0 && s.routed_experts.empty()) {
        ++stats.unrouted_dropped;
        continue;
      }
      fresh.push_back(&s);
    }
    std::vector<double> rewards;
    for (const PolicySample* s : fresh) rewards.push_back(s->reward);
    const std::vector<double> adv = GroupAdvantages(options_.advantage, rewards);
    bool uniform = true;
    for (double a : adv) uniform = uniform && a == 0;
    if (uniform) {
      ++stats.uniform_groups;
      if (options_.skip_uniform_groups) continue;
    }
    for (size_t i = 0; i < fresh.size(); ++i) {
      const PolicySample& s = *fresh[i];
      used.emplace_back(&s, adv[i]);
      ++stats.samples;
      stats.tokens += static_cast<int64_t>(s.tokens.size());
      for (size_t t = 1; t < s.tokens.size(); ++t) {
        if (s.loss_mask[t]) ++stats.staleness[version_ - s.policy_versions[t]];
      }
    }
  }

  // 3. Minibatches (contiguous runs of samples, as even in count as they divide), each packed
  // into micro-batches; minibatch m's masked tokens over every rank are its token-mean divisor.
  const int mb_count = options_.minibatches;
  std::vector<std::vector<MicroBatch>> minibatches(mb_count);
  std::vector<double> mb_tokens(mb_count, 0.0);
  for (int m = 0; m < mb_count; ++m) {
    const size_t lo = used.size() * m / mb_count, hi = used.size() * (m + 1) / mb_count;
    std::vector<MicroBatch>& micro = minibatches[m];
    for (size_t i = lo; i < hi; ++i) {
      const PolicySample& s = *used[i].first;
      const int64_t n = static_cast<int64_t>(s.tokens.size());
      if (micro.empty() ||
          (micro.back().tokens > 0 && micro.back().tokens + n > options_.micro_batch_tokens)) {
        micro.emplace_back();
      }
      micro.back().samples.push_back(&s);
      micro.back().advantages.push_back(used[i].second);
      micro.back().tokens += n;
      for (int64_t t = 1; t < n; ++t) mb_tokens[m] += s.loss_mask[t];
    }
    for (MicroBatch& mb : micro) Pack(mb, layers, k, forced);
  }
  ORRERY_RETURN_IF_ERROR(comm_->AllReduceSum(std::span<double>(mb_tokens)));
  double total_tokens = 0;
  for (double t : mb_tokens) total_tokens += t;
  stats.version = version_;
  if (total_tokens == 0) return stats;  // every rank sees 0: all skip together

  PolicyPassOptions pass;
  pass.temperature = options_.temperature;
  // π_prox is the policy before this update. The first optimizer step's forward is still that
  // policy (LossBackward takes it from its own forward: proximal_logprobs left empty); every
  // later minibatch gets its log-probabilities from a forward now, before any step.
  if (options_.ppo_epochs * mb_count > 1) {
    for (int m = 1; m < mb_count; ++m) {
      for (MicroBatch& mb : minibatches[m]) {
        ORRERY_ASSIGN_OR_RETURN(mb.in.proximal_logprobs, model_->Logprobs(mb.batch, mb.in, pass));
      }
    }
  }

  // 4-5. ppo_epochs passes over the minibatches, one optimizer step each.
  const std::vector<ParamRef> params = model_->Parameters();
  double grad_norm_sum = 0;
  std::vector<Tensor> scores;
  for (int epoch = 0; epoch < options_.ppo_epochs; ++epoch) {
    for (int m = 0; m < mb_count; ++m) {
      if (mb_tokens[m] == 0) continue;  // on every rank alike
      ORRERY_RETURN_IF_ERROR(model_->ZeroGrad());
      // Each rank's gradient is averaged over ranks below, so scale by world / global tokens.
      pass.grad_scale = comm_->world_size() / mb_tokens[m];
      // Quantile Balancing reads the last pass; routing agreement is measured in the first.
      pass.keep_for_balancing = epoch + 1 == options_.ppo_epochs;
      pass.router_scores = forced && epoch == 0 ? &scores : nullptr;
      for (MicroBatch& mb : minibatches[m]) {
        ORRERY_ASSIGN_OR_RETURN(PolicyLossStats s,
                                model_->LossBackward(mb.batch, &mb.in, options_.loss, pass));
        stats.loss.Add(s);
        if (pass.router_scores != nullptr) {
          AddRoutingAgreement(mb, scores, model_->balancing_biases(), cfg.moe.num_experts, k,
                              &agree, &compared);
        }
      }
      // Gradients over ranks, clipping, AdamW.
      ORRERY_RETURN_IF_ERROR(AllReduceGradients(*comm_, params));
      ORRERY_ASSIGN_OR_RETURN(double norm, adamw_->ClipGradNorm(options_.max_grad_norm));
      grad_norm_sum += norm;
      ORRERY_RETURN_IF_ERROR(adamw_->Step(options_.lr));
      ++stats.optimizer_steps;
    }
  }
  stats.grad_norm = grad_norm_sum / static_cast<double>(stats.optimizer_steps);
  for (int l = 0; l < layers; ++l) {
    if (compared[l] > 0) stats.routing_agreement[l] = agree[l] / compared[l];
  }

  // Loss statistics over ranks.
  std::vector<double> sums = {stats.loss.loss_sum,         stats.loss.tokens,
                              stats.loss.clipped,          stats.loss.is_weight_sum,
                              stats.loss.is_weight_sq_sum, stats.loss.is_masked,
                              stats.loss.entropy_sum,      stats.loss.ratio_sum,
                              stats.loss.approx_kl_sum,    stats.loss.ref_kl_sum};
  ORRERY_RETURN_IF_ERROR(comm_->AllReduceSum(std::span<double>(sums)));
  stats.loss = {sums[0], sums[1], sums[2], sums[3], sums[4],
                sums[5], sums[6], sums[7], sums[8], sums[9]};

  // Quantile Balancing from the last pass over the global batch of every rank (the quantiles of
  // all ranks' router scores, not an average of per-rank biases): the same biases everywhere.
  model::BalancingMetrics balance;
  const model::RankGroup group{comm_->rank(), comm_->world_size(),
                               [this](std::span<double> d) { return comm_->AllReduceSum(d); }};
  ORRERY_RETURN_IF_ERROR(model_->UpdateBalancing(&balance, group));
  stats.expert_load = balance.load;
  stats.router_entropy = balance.router_entropy;

  ++version_;
  stats.version = version_;
  stats.updated = true;
  return stats;
}

StatusOr<std::string> RlTrainer::SaveCheckpoint(const std::string& checkpoints_dir, int64_t keep,
                                                const std::map<std::string, std::string>& files) {
  CheckpointContents c;
  c.files = files;
  c.state.step = version_;
  c.state.optimizer_step = adamw_->step();
  for (const ParamRef& p : model_->Parameters()) c.model.emplace_back(p.name, p.value);
  for (size_t i = 0; i < model_->balancing_biases().size(); ++i) {
    c.model.emplace_back(BiasName(model_->config(), i), model_->balancing_biases()[i]);
  }
  c.optimizer = adamw_->StateTensors();
  return WriteCheckpoint(checkpoints_dir, c, keep);
}

Status RlTrainer::RestoreLatest(const std::string& checkpoints_dir) {
  ORRERY_ASSIGN_OR_RETURN(std::string dir, LatestCheckpoint(checkpoints_dir));
  return Restore(dir);
}

Status RlTrainer::Restore(const std::string& dir) {
  ORRERY_ASSIGN_OR_RETURN(LoadedCheckpoint ck, ReadCheckpoint(dir));
  for (const ParamRef& p : model_->Parameters()) {
    auto it = ck.model.find(p.name);
    if (it == ck.model.end()) return NotFoundError(dir + ": tensor '" + p.name + "' is missing");
    Tensor value = p.value;
    ORRERY_RETURN_IF_ERROR(value.CopyFrom(it->second).WithContext(dir + ": " + p.name));
  }
  for (size_t i = 0; i < model_->balancing_biases().size(); ++i) {
    const std::string name = BiasName(model_->config(), i);
    auto it = ck.model.find(name);
    if (it == ck.model.end()) return NotFoundError(dir + ": tensor '" + name + "' is missing");
    ORRERY_RETURN_IF_ERROR(model_->balancing_biases()[i].CopyFrom(it->second));
  }
  ORRERY_RETURN_IF_ERROR(model_->ParametersLoaded());
  ORRERY_RETURN_IF_ERROR(adamw_->LoadState(ck.optimizer, ck.state.optimizer_step));
  version_ = ck.state.step;
  return Status::OK();
}

}  // namespace orrery::rl
