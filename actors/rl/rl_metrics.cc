#include "actors/rl/rl_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "actors/rl/policy_eval.h"

namespace orrery::rl_actors {
namespace {

// Linear-interpolated percentile of sorted values (q in [0, 1]).
double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(sorted.size() - 1, lo + 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

}  // namespace

MetricRecord RolloutRecord(const std::string& source, int64_t step,
                           const std::vector<rollout::TrajectoryGroup>& groups,
                           int64_t generated_tokens, double generation_seconds) {
  MetricRecord r;
  r.time = UnixSeconds();
  r.source = source;
  r.step = step;
  std::vector<double> rewards, latencies;
  struct EnvSums {
    double reward = 0, passed = 0, episodes = 0;
  };
  std::map<std::string, EnvSums> per_env;
  double length = 0, tool_calls = 0, tool_errors = 0, passed = 0, episodes = 0, faults = 0;
  double truncated = 0, min_length = 0, max_length = 0;
  for (const rollout::TrajectoryGroup& g : groups) {
    for (const rollout::Trajectory& t : g.trajectories) {
      ++episodes;
      // An environment fault says nothing of the policy: no reward, not trained on.
      if (t.env_fault()) {
        ++faults;
        continue;
      }
      rewards.push_back(t.reward);
      const bool pass = EpisodePassed(t);
      passed += pass;
      EnvSums& e = per_env[t.env_name];
      e.reward += t.reward;
      e.passed += pass;
      e.episodes += 1;
      const double size = static_cast<double>(t.size());
      min_length = rewards.size() == 1 ? size : std::min(min_length, size);
      max_length = std::max(max_length, size);
      length += size;
      truncated += t.status == rollout::EpisodeStatus::kTruncated;
      tool_calls += static_cast<double>(t.tool_calls.size());
      for (const rollout::ToolCallRecord& c : t.tool_calls) {
        tool_errors += c.error.empty() ? 0 : 1;
        latencies.push_back(c.latency_ms / 1000.0);
      }
    }
  }
  if (episodes > 0) r.scalars["rollout/env_fault_ratio"] = faults / episodes;
  if (rewards.empty()) return r;
  const double n = static_cast<double>(rewards.size());
  double sum = 0;
  for (double v : rewards) sum += v;
  std::sort(rewards.begin(), rewards.end());
  r.scalars["reward/mean"] = sum / n;
  r.scalars["reward/pass_rate"] = passed / n;
  r.scalars["reward/p10"] = Percentile(rewards, 0.1);
  r.scalars["reward/p50"] = Percentile(rewards, 0.5);
  r.scalars["reward/p90"] = Percentile(rewards, 0.9);
  for (const auto& [env, e] : per_env) {
    r.scalars["reward/env/" + env + "/mean"] = e.reward / e.episodes;
    r.scalars["reward/env/" + env + "/pass_rate"] = e.passed / e.episodes;
  }
  r.scalars["rollout/episode_length_tokens"] = length / n;
  r.scalars["rollout/episode_length_tokens_min"] = min_length;
  r.scalars["rollout/episode_length_tokens_max"] = max_length;
  r.scalars["rollout/truncated_ratio"] = truncated / n;
  r.scalars["rollout/tool_calls_per_episode"] = tool_calls / n;
  r.scalars["rollout/tool_error_ratio"] = tool_calls > 0 ? tool_errors / tool_calls : 0.0;
  if (!latencies.empty()) {
    std::sort(latencies.begin(), latencies.end());
    r.scalars["rollout/sandbox_latency_p50_seconds"] = Percentile(latencies, 0.5);
    r.scalars["rollout/sandbox_latency_p99_seconds"] = Percentile(latencies, 0.99);
  }
  if (generation_seconds > 0) {
    r.scalars["rollout/generation_tokens_per_second"] =
        static_cast<double>(generated_tokens) / generation_seconds;
  }
  return r;
}

MetricRecord LearnerRecord(const std::string& source, const rl::RlStepStats& stats,
                           model::Model& model, int64_t tokens_total, int64_t max_staleness,
                           const WeightSyncTimes& sync) {
  MetricRecord r;
  r.time = UnixSeconds();
  r.source = source;
  r.step = stats.version;
  const rl::PolicyLossStats& l = stats.loss;
  r.scalars["learner/loss"] = l.tokens > 0 ? l.loss_sum / l.tokens : 0.0;
  r.scalars["learner/is_weight_mean"] = l.is_weight_mean();
  r.scalars["learner/is_weight_std"] = l.is_weight_std();
  r.scalars["learner/is_weight_ess_ratio"] = l.is_weight_ess();
  r.scalars["learner/clip_ratio"] = l.clip_fraction();
  r.scalars["learner/entropy"] = l.entropy_mean();
  r.scalars["learner/approx_kl"] = l.tokens > 0 ? l.approx_kl_sum / l.tokens : 0.0;
  r.scalars["learner/grad_norm"] = stats.grad_norm;
  r.scalars["learner/tokens_total"] = static_cast<double>(tokens_total);
  r.scalars["learner/groups"] = static_cast<double>(stats.groups);
  r.scalars["learner/samples"] = static_cast<double>(stats.samples);
  r.scalars["learner/stale_dropped"] = static_cast<double>(stats.stale_dropped);
  r.scalars["learner/unrouted_dropped"] = static_cast<double>(stats.unrouted_dropped);
  r.scalars["learner/env_fault_dropped"] = static_cast<double>(stats.env_fault_dropped);
  r.scalars["learner/optimizer_steps"] = static_cast<double>(stats.optimizer_steps);
  r.scalars["learner/uniform_groups"] = static_cast<double>(stats.uniform_groups);
  if (sync.shared_snapshot_seconds > 0) {
    r.scalars["learner/weight_sync_seconds/phase/shared_snapshot"] = sync.shared_snapshot_seconds;
  }
  if (sync.host_copy_seconds > 0) {
    r.scalars["learner/weight_sync_seconds/phase/host_copy"] = sync.host_copy_seconds;
  }
  r.scalars["learner/weight_sync_seconds/phase/snapshot"] = sync.snapshot_seconds;
  r.scalars["learner/weight_sync_seconds/phase/write"] = sync.write_seconds;
  int64_t bins = std::max<int64_t>(max_staleness, 0) + 1;
  for (const auto& [behind, tokens] : stats.staleness) bins = std::max(bins, behind + 1);
  std::vector<double> staleness(static_cast<size_t>(bins), 0.0);
  for (const auto& [behind, tokens] : stats.staleness) {
    if (behind >= 0) staleness[static_cast<size_t>(behind)] += static_cast<double>(tokens);
  }
  r.vectors["learner/staleness_by_version"] = staleness;

  double max_violation = 0, dead = 0;
  for (size_t layer = 0; layer < stats.expert_load.size(); ++layer) {
    const std::vector<double>& load = stats.expert_load[layer];
    for (double v : load) {
      max_violation = std::max(max_violation, v - 1.0);
      dead += v <= 0 ? 1 : 0;
    }
    r.vectors["routing/expert_load/layer" + std::to_string(layer)] = load;
  }
  const std::vector<Tensor>& biases = model.balancing_biases();
  for (size_t layer = 0; layer < biases.size(); ++layer) {
    const Tensor& b = biases[layer];
    std::vector<double> v(static_cast<size_t>(b.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = b.data<float>()[i];
    r.vectors["routing/qb_bias/layer" + std::to_string(layer)] = v;
  }
  if (!stats.expert_load.empty()) {
    r.scalars["routing/max_load_violation"] = max_violation;
    r.scalars["routing/dead_experts"] = dead;
  }
  if (!stats.router_entropy.empty()) {
    double sum = 0;
    for (double h : stats.router_entropy) sum += h;
    r.scalars["routing/router_entropy"] = sum / static_cast<double>(stats.router_entropy.size());
  }
  if (!stats.routing_agreement.empty()) {
    double sum = 0;
    for (double a : stats.routing_agreement) sum += a;
    r.scalars["routing/agreement_ratio"] =
        sum / static_cast<double>(stats.routing_agreement.size());
  }
  return r;
}

}  // namespace orrery::rl_actors
