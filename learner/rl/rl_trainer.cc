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

std::vector<ParamRef> ParamRefs(model::Model& m) {
  std::vector<ParamRef> out;
  for (model::Parameter& p : m.parameters())
    out.push_back({p.name, p.value, p.grad, p.weight_decay});
  return out;
}

// One packed micro-batch: samples as documents of one row.
struct MicroBatch {
  std::vector<const PolicySample*> samples;
  std::vector<double> advantages;
  int64_t tokens = 0;
};

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
  return Status::OK();
}

RlTrainer::RlTrainer(model::Model* model, comm::Communicator* comm, RlTrainerOptions options,
                     std::unique_ptr<AdamW> adamw)
    : model_(model), comm_(comm), options_(options), adamw_(std::move(adamw)) {}

StatusOr<std::unique_ptr<RlTrainer>> RlTrainer::Create(model::Model* model,
                                                       comm::Communicator* comm,
                                                       RlTrainerOptions options) {
  ORRERY_RETURN_IF_ERROR(ValidateRlTrainerOptions(options));
  if (model->dtype() != DType::kF32) return InvalidArgumentError("rl: the model must be f32");
  ORRERY_ASSIGN_OR_RETURN(AdamW adamw, AdamW::Create(options.adamw, ParamRefs(*model)));
  return std::unique_ptr<RlTrainer>(
      new RlTrainer(model, comm, options, std::make_unique<AdamW>(std::move(adamw))));
}

StatusOr<RlStepStats> RlTrainer::Step(const std::vector<PolicyGroup>& groups) {
  const model::ModelConfig& cfg = model_->config();
  const int layers = static_cast<int>(cfg.num_moe_layers());
  const int k = static_cast<int>(cfg.moe.top_k);
  RlStepStats stats;
  stats.routing_agreement.assign(layers, 1.0);
  std::vector<double> agree(layers, 0.0), compared(layers, 0.0);

  // 1-2. Staleness window, advantages, micro-batches.
  std::vector<MicroBatch> micro(1);
  double local_tokens = 0;
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
      const int64_t n = static_cast<int64_t>(s.tokens.size());
      if (micro.back().tokens > 0 && micro.back().tokens + n > options_.micro_batch_tokens) {
        micro.emplace_back();
      }
      micro.back().samples.push_back(&s);
      micro.back().advantages.push_back(adv[i]);
      micro.back().tokens += n;
      ++stats.samples;
      for (int64_t t = 1; t < n; ++t) {
        if (!s.loss_mask[t]) continue;
        local_tokens += 1;
        ++stats.staleness[version_ - s.policy_versions[t]];
      }
    }
  }
  if (micro.back().samples.empty()) micro.pop_back();

  // Token-mean over every rank's masked tokens.
  double total_tokens = local_tokens;
  ORRERY_RETURN_IF_ERROR(comm_->AllReduceSum(std::span<double>(&total_tokens, 1)));
  stats.version = version_;
  if (total_tokens == 0) return stats;  // every rank sees 0: all skip together

  model_->ZeroGrad();
  const double inv_t = 1.0 / options_.temperature;
  // Each rank's gradient is averaged over ranks below, so scale by world / global tokens.
  const double grad_scale = comm_->world_size() / total_tokens;
  std::vector<model::ForwardCache> caches(micro.size());
  for (size_t b = 0; b < micro.size(); ++b) {
    const MicroBatch& mb = micro[b];
    const int64_t n = mb.tokens;
    std::vector<int32_t> flat;
    std::vector<int64_t> cu = {0};
    PolicyLossInput in;
    const bool forced = options_.routing_replay && layers > 0;  // every sample has its routing
    Tensor forced_ids;
    if (forced) forced_ids = Tensor::Empty({layers, n, k}, DType::kI32);
    for (size_t i = 0; i < mb.samples.size(); ++i) {
      const PolicySample& s = *mb.samples[i];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      const int64_t base = cu.back();
      flat.insert(flat.end(), s.tokens.begin(), s.tokens.end());
      cu.push_back(base + len);
      for (int64_t t = 0; t < len; ++t) {
        const bool target = t + 1 < len;
        in.targets.push_back(target ? s.tokens[t + 1] : -1);
        in.mask.push_back(target ? s.loss_mask[t + 1] : 0);
        in.behaviour_logprobs.push_back(target ? s.behaviour_logprobs[t + 1] : 0.0f);
        in.advantages.push_back(static_cast<float>(mb.advantages[i]));
        in.sequence_ids.push_back(static_cast<int32_t>(i));
        if (forced) {
          for (int l = 0; l < layers; ++l) {
            for (int j = 0; j < k; ++j) {
              forced_ids.data<int32_t>()[(l * n + base + t) * k + j] =
                  s.routed_experts[(t * layers + l) * k + j];
            }
          }
        }
      }
    }
    model::Batch batch;
    batch.tokens = Tensor::FromVector<int32_t>({1, n}, flat);
    batch.cu_seqlens = Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
    if (forced) batch.forced_experts = forced_ids;
    ORRERY_ASSIGN_OR_RETURN(Tensor logits, model_->Forward(batch, &caches[b]));
    stats.tokens += n;
    float* z = logits.data<float>();
    for (int64_t i = 0; i < logits.numel(); ++i) z[i] = static_cast<float>(z[i] * inv_t);
    // π_prox: the policy before this update, i.e. this forward's (detached) log-probabilities.
    ORRERY_ASSIGN_OR_RETURN(in.proximal_logprobs, TokenLogprobs(logits, in.targets));
    Tensor dlogits;
    ORRERY_ASSIGN_OR_RETURN(PolicyLossStats s,
                            PolicyLoss(options_.loss, logits, in, grad_scale, &dlogits));
    stats.loss.Add(s);
    float* dz = dlogits.data<float>();
    for (int64_t i = 0; i < dlogits.numel(); ++i) dz[i] = static_cast<float>(dz[i] * inv_t);
    ORRERY_RETURN_IF_ERROR(model_->Backward(caches[b], dlogits));

    // Routing agreement: would the learner's router (scores + current biases) pick the recorded
    // experts? Positions whose routing was recorded: all but each sample's last.
    if (forced) {
      const int64_t e = cfg.moe.num_experts;
      for (int l = 0; l < layers; ++l) {
        const float* scores = caches[b].router_scores()[l].data<float>();
        const float* bias = model_->balancing_biases()[l].data<float>();
        std::vector<std::pair<float, int>> order(e);
        for (size_t i = 0; i + 1 < cu.size(); ++i) {
          for (int64_t p = cu[i]; p + 1 < cu[i + 1]; ++p) {
            for (int64_t x = 0; x < e; ++x) order[x] = {-(scores[p * e + x] + bias[x]), int(x)};
            std::partial_sort(order.begin(), order.begin() + k, order.end());
            for (int j = 0; j < k; ++j) {
              const int32_t want = forced_ids.data<int32_t>()[(l * n + p) * k + j];
              for (int q = 0; q < k; ++q) agree[l] += order[q].second == want;
            }
            compared[l] += k;
          }
        }
      }
    }
  }
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

  // 4. Gradients over ranks, clipping, AdamW.
  std::vector<Tensor> grads;
  for (model::Parameter& p : model_->parameters()) grads.push_back(p.grad);
  ORRERY_RETURN_IF_ERROR(comm::AllReduceMean(*comm_, grads));
  ORRERY_ASSIGN_OR_RETURN(stats.grad_norm, adamw_->ClipGradNorm(options_.max_grad_norm));
  ORRERY_RETURN_IF_ERROR(adamw_->Step(options_.lr));

  // 5. Quantile Balancing, then the same biases on every rank.
  std::vector<const model::ForwardCache*> cache_ptrs;
  for (const auto& c : caches) cache_ptrs.push_back(&c);
  model::BalancingMetrics balance;
  ORRERY_RETURN_IF_ERROR(model_->UpdateBalancingBiases(cache_ptrs, &balance));
  ORRERY_RETURN_IF_ERROR(comm::AllReduceMean(*comm_, model_->balancing_biases()));
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
  for (model::Parameter& p : model_->parameters()) c.model.emplace_back(p.name, p.value);
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
  for (model::Parameter& p : model_->parameters()) {
    auto it = ck.model.find(p.name);
    if (it == ck.model.end()) return NotFoundError(dir + ": tensor '" + p.name + "' is missing");
    ORRERY_RETURN_IF_ERROR(p.value.CopyFrom(it->second).WithContext(dir + ": " + p.name));
  }
  for (size_t i = 0; i < model_->balancing_biases().size(); ++i) {
    const std::string name = BiasName(model_->config(), i);
    auto it = ck.model.find(name);
    if (it == ck.model.end()) return NotFoundError(dir + ": tensor '" + name + "' is missing");
    ORRERY_RETURN_IF_ERROR(model_->balancing_biases()[i].CopyFrom(it->second));
  }
  ORRERY_RETURN_IF_ERROR(adamw_->LoadState(ck.optimizer, ck.state.optimizer_step));
  version_ = ck.state.step;
  return Status::OK();
}

}  // namespace orrery::rl
