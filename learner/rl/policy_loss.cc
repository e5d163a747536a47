#include "learner/rl/policy_loss.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/thread_pool.h"

namespace orrery::rl {
namespace {

struct RowStats {
  double lse = 0;      // logsumexp of the row
  double logp = 0;     // log softmax at the target
  double entropy = 0;  // -Σ p log p
};

template <typename T>
void ComputeRows(const T* z, int64_t n, int64_t v, const std::vector<int32_t>& targets,
                 const std::vector<uint8_t>* mask, std::vector<RowStats>* rows) {
  ThreadPool::Default().ParallelFor(n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (targets[i] < 0 || (mask != nullptr && (*mask)[i] == 0)) continue;
      const T* zi = z + i * v;
      double mx = zi[0];
      for (int64_t j = 1; j < v; ++j) mx = std::max(mx, static_cast<double>(zi[j]));
      double sum = 0, wsum = 0;
      for (int64_t j = 0; j < v; ++j) {
        const double e = std::exp(static_cast<double>(zi[j]) - mx);
        sum += e;
        wsum += e * (static_cast<double>(zi[j]) - mx);
      }
      RowStats& r = (*rows)[i];
      r.lse = mx + std::log(sum);
      r.logp = static_cast<double>(zi[targets[i]]) - r.lse;
      // H = lse - Σ p z  (with the max shifted out of both terms).
      r.entropy = std::log(sum) - wsum / sum;
    }
  });
}

Status CheckLogits(const Tensor& logits, const std::vector<int32_t>& targets, const char* what) {
  if (!logits.defined() || logits.ndim() != 2 || !logits.device().is_cpu() ||
      (logits.dtype() != DType::kF32 && logits.dtype() != DType::kF64)) {
    return InvalidArgumentError(std::string(what) + ": logits must be a CPU f32 or f64 [N, V] " +
                                "tensor, got " +
                                (logits.defined() ? logits.ToString() : std::string("undefined")));
  }
  const int64_t n = logits.dim(0), v = logits.dim(1);
  if (static_cast<int64_t>(targets.size()) != n) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(targets.size()) +
                                " targets for " + std::to_string(n) + " logit rows");
  }
  for (int32_t t : targets) {
    if (t >= v) {
      return OutOfRangeError(std::string(what) + ": target " + std::to_string(t) +
                             " outside the vocabulary of " + std::to_string(v));
    }
  }
  return Status::OK();
}

template <typename T>
void WriteGradient(const T* z, T* dz, int64_t n, int64_t v, const std::vector<int32_t>& targets,
                   const std::vector<RowStats>& rows, const std::vector<double>& dlogp,
                   const std::vector<double>& dentropy) {
  ThreadPool::Default().ParallelFor(n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* di = dz + i * v;
      if (dlogp[i] == 0 && dentropy[i] == 0) {
        std::fill(di, di + v, T(0));
        continue;
      }
      const T* zi = z + i * v;
      const RowStats& r = rows[i];
      // d logp / dz_j = 1[j = y] - p_j;  d H / dz_j = -p_j (log p_j + H).
      for (int64_t j = 0; j < v; ++j) {
        const double logpj = static_cast<double>(zi[j]) - r.lse;
        const double pj = std::exp(logpj);
        di[j] = static_cast<T>(-dlogp[i] * pj - dentropy[i] * pj * (logpj + r.entropy));
      }
      di[targets[i]] += static_cast<T>(dlogp[i]);
    }
  });
}

}  // namespace

StatusOr<IsCorrection> ParseIsCorrection(const std::string& name) {
  if (name == "none") return IsCorrection::kNone;
  if (name == "truncate") return IsCorrection::kTruncate;
  if (name == "mask") return IsCorrection::kMask;
  return InvalidArgumentError("unknown importance-sampling correction '" + name +
                              "' (expected none, truncate or mask)");
}

StatusOr<IsLevel> ParseIsLevel(const std::string& name) {
  if (name == "token") return IsLevel::kToken;
  if (name == "sequence") return IsLevel::kSequence;
  if (name == "geometric") return IsLevel::kGeometric;
  return InvalidArgumentError("unknown importance-sampling level '" + name +
                              "' (expected token, sequence or geometric)");
}

Status ValidatePolicyLossOptions(const PolicyLossOptions& o) {
  if (!(o.clip_low > 0 && o.clip_low < 1)) {
    return InvalidArgumentError("policy loss: clip_low must be in (0, 1), got " +
                                std::to_string(o.clip_low));
  }
  if (!(o.clip_high > 0)) {
    return InvalidArgumentError("policy loss: clip_high must be > 0, got " +
                                std::to_string(o.clip_high));
  }
  if (o.correction != IsCorrection::kNone && !(o.is_cap > 1)) {
    return InvalidArgumentError("policy loss: is_cap must be > 1, got " + std::to_string(o.is_cap));
  }
  if (!(o.entropy_coef >= 0) || !(o.kl_coef >= 0)) {
    return InvalidArgumentError("policy loss: entropy_coef and kl_coef must be >= 0");
  }
  return Status::OK();
}

void PolicyLossStats::Add(const PolicyLossStats& o) {
  loss_sum += o.loss_sum;
  tokens += o.tokens;
  clipped += o.clipped;
  is_weight_sum += o.is_weight_sum;
  is_weight_sq_sum += o.is_weight_sq_sum;
  is_masked += o.is_masked;
  entropy_sum += o.entropy_sum;
  ratio_sum += o.ratio_sum;
  approx_kl_sum += o.approx_kl_sum;
  ref_kl_sum += o.ref_kl_sum;
}

double PolicyLossStats::is_weight_std() const {
  if (tokens <= 0) return 0;
  const double mean = is_weight_sum / tokens;
  return std::sqrt(std::max(0.0, is_weight_sq_sum / tokens - mean * mean));
}

double PolicyLossStats::is_weight_ess() const {
  if (tokens <= 0 || is_weight_sq_sum <= 0) return 0;
  return is_weight_sum * is_weight_sum / (tokens * is_weight_sq_sum);
}

StatusOr<std::vector<float>> TokenLogprobs(const Tensor& logits,
                                           const std::vector<int32_t>& targets,
                                           std::vector<float>* entropy) {
  ORRERY_RETURN_IF_ERROR(CheckLogits(logits, targets, "token logprobs"));
  const int64_t n = logits.dim(0), v = logits.dim(1);
  std::vector<RowStats> rows(n);
  if (logits.dtype() == DType::kF32) {
    ComputeRows(logits.data<float>(), n, v, targets, nullptr, &rows);
  } else {
    ComputeRows(logits.data<double>(), n, v, targets, nullptr, &rows);
  }
  std::vector<float> out(n, 0.0f);
  if (entropy != nullptr) entropy->assign(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] < 0) continue;
    out[i] = static_cast<float>(rows[i].logp);
    if (entropy != nullptr) (*entropy)[i] = static_cast<float>(rows[i].entropy);
  }
  return out;
}

namespace {

Status CheckPolicyLossInput(const PolicyLossOptions& options, const PolicyLossInput& in, size_t n) {
  if (in.targets.size() != n || in.mask.size() != n || in.behaviour_logprobs.size() != n ||
      in.proximal_logprobs.size() != n || in.advantages.size() != n ||
      in.sequence_ids.size() != n) {
    return InvalidArgumentError(
        "policy loss: targets, mask, behaviour_logprobs, proximal_logprobs, advantages and "
        "sequence_ids must each have one entry per logit row (" +
        std::to_string(n) + ")");
  }
  if (options.kl_coef > 0 && in.ref_logprobs.size() != n) {
    return InvalidArgumentError("policy loss: kl_coef > 0 needs one reference logprob per row");
  }
  for (size_t i = 0; i < n; ++i) {
    if (in.mask[i] != 0 && in.targets[i] < 0) {
      return InvalidArgumentError("policy loss: row " + std::to_string(i) +
                                  " is in the loss mask but has no target");
    }
    if (i > 0 && in.sequence_ids[i] < in.sequence_ids[i - 1]) {
      return InvalidArgumentError("policy loss: sequence_ids must be non-decreasing (row " +
                                  std::to_string(i) + ")");
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::vector<double>> BehaviourWeights(const PolicyLossOptions& options,
                                               const PolicyLossInput& in, PolicyLossStats* stats) {
  ORRERY_RETURN_IF_ERROR(ValidatePolicyLossOptions(options));
  const int64_t n = static_cast<int64_t>(in.mask.size());
  ORRERY_RETURN_IF_ERROR(CheckPolicyLossInput(options, in, in.mask.size()));
  // Behaviour log-weights log(π_prox/μ) at the configured level.
  std::vector<double> log_rho(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    log_rho[i] = static_cast<double>(in.proximal_logprobs[i]) - in.behaviour_logprobs[i];
  }
  if (options.level != IsLevel::kToken) {
    for (int64_t begin = 0; begin < n;) {
      int64_t end = begin;
      double sum = 0, count = 0;
      while (end < n && in.sequence_ids[end] == in.sequence_ids[begin]) {
        if (in.mask[end] != 0) {
          sum += log_rho[end];
          count += 1;
        }
        ++end;
      }
      const double level =
          options.level == IsLevel::kSequence ? sum : (count > 0 ? sum / count : 0);
      for (int64_t i = begin; i < end; ++i) log_rho[i] = level;
      begin = end;
    }
  }
  std::vector<double> w(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (in.mask[i] == 0) continue;
    w[i] = 1.0;
    if (options.correction == IsCorrection::kTruncate) {
      w[i] = std::exp(std::min(log_rho[i], std::log(options.is_cap)));
    } else if (options.correction == IsCorrection::kMask) {
      w[i] = std::abs(log_rho[i]) <= std::log(options.is_cap) ? 1.0 : 0.0;
      if (w[i] == 0 && stats != nullptr) stats->is_masked += 1;
    }
    if (stats != nullptr) {
      stats->is_weight_sum += w[i];
      stats->is_weight_sq_sum += w[i] * w[i];
    }
  }
  return w;
}

StatusOr<PolicyLossStats> PolicyLoss(const PolicyLossOptions& options, const Tensor& logits,
                                     const PolicyLossInput& in, double grad_scale,
                                     Tensor* dlogits) {
  ORRERY_RETURN_IF_ERROR(ValidatePolicyLossOptions(options));
  ORRERY_RETURN_IF_ERROR(CheckLogits(logits, in.targets, "policy loss"));
  const int64_t n = logits.dim(0), v = logits.dim(1);
  ORRERY_RETURN_IF_ERROR(CheckPolicyLossInput(options, in, static_cast<size_t>(n)));

  std::vector<RowStats> rows(n);
  if (logits.dtype() == DType::kF32) {
    ComputeRows(logits.data<float>(), n, v, in.targets, &in.mask, &rows);
  } else {
    ComputeRows(logits.data<double>(), n, v, in.targets, &in.mask, &rows);
  }

  PolicyLossStats stats;
  ORRERY_ASSIGN_OR_RETURN(const std::vector<double> weights, BehaviourWeights(options, in, &stats));
  std::vector<double> dlogp(n, 0.0), dentropy(n, 0.0);
  const double lo = 1.0 - options.clip_low, hi = 1.0 + options.clip_high;
  for (int64_t i = 0; i < n; ++i) {
    if (in.mask[i] == 0) continue;
    const RowStats& r = rows[i];
    const double w = weights[i];
    const double a = in.advantages[i];
    const double log_ratio = r.logp - in.proximal_logprobs[i];
    const double ratio = std::exp(log_ratio);
    const double unclipped = ratio * a;
    const double clipped = std::clamp(ratio, lo, hi) * a;
    // min(rA, clip(r)A): the clipped branch is taken only when it is strictly smaller, i.e. r is
    // outside [lo, hi] on the side that would increase the objective; its gradient is zero.
    const bool clip_active = clipped < unclipped;
    const double surrogate = clip_active ? clipped : unclipped;
    double loss = -w * surrogate - options.entropy_coef * r.entropy;
    double g = clip_active ? 0.0 : -w * a * ratio;  // d loss / d logp
    if (options.kl_coef > 0) {
      const double d = in.ref_logprobs[i] - r.logp;
      const double k3 = std::exp(d) - d - 1.0;
      loss += options.kl_coef * k3;
      g += options.kl_coef * (1.0 - std::exp(d));
      stats.ref_kl_sum += k3;
    }
    dlogp[i] = grad_scale * g;
    dentropy[i] = -grad_scale * options.entropy_coef;
    stats.loss_sum += loss;
    stats.tokens += 1;
    stats.clipped += clip_active ? 1 : 0;
    stats.entropy_sum += r.entropy;
    stats.ratio_sum += ratio;
    stats.approx_kl_sum += (ratio - 1.0) - log_ratio;
  }

  if (dlogits != nullptr) {
    *dlogits = Tensor::Empty({n, v}, logits.dtype());
    if (logits.dtype() == DType::kF32) {
      WriteGradient(logits.data<float>(), dlogits->data<float>(), n, v, in.targets, rows, dlogp,
                    dentropy);
    } else {
      WriteGradient(logits.data<double>(), dlogits->data<double>(), n, v, in.targets, rows, dlogp,
                    dentropy);
    }
  }
  return stats;
}

}  // namespace orrery::rl
