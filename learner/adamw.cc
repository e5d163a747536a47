#include "learner/adamw.h"

#include <cmath>
#include <set>

#include "core/thread_pool.h"

namespace orrery {

AdamW::AdamW(AdamWOptions options, std::vector<ParamRef> params)
    : options_(options), params_(std::move(params)) {
  for (const ParamRef& p : params_) {
    m_.push_back(Tensor::Zeros(p.value.shape(), DType::kF32));
    v_.push_back(Tensor::Zeros(p.value.shape(), DType::kF32));
  }
}

StatusOr<AdamW> AdamW::Create(AdamWOptions options, std::vector<ParamRef> params) {
  std::set<std::string> names;
  for (const ParamRef& p : params) {
    if (!names.insert(p.name).second) {
      return InvalidArgumentError("optimizer: parameter name '" + p.name + "' appears twice");
    }
    if (!p.value.defined() || !p.grad.defined() || p.value.dtype() != DType::kF32 ||
        p.grad.dtype() != DType::kF32 || !p.value.device().is_cpu() || !p.grad.device().is_cpu() ||
        p.value.shape() != p.grad.shape()) {
      return InvalidArgumentError("optimizer: parameter '" + p.name +
                                  "' needs f32 CPU value and gradient of one shape");
    }
  }
  if (options.beta1 < 0 || options.beta1 >= 1 || options.beta2 < 0 || options.beta2 >= 1 ||
      options.eps <= 0 || options.weight_decay < 0) {
    return InvalidArgumentError("optimizer: betas must be in [0, 1), eps > 0, weight_decay >= 0");
  }
  return AdamW(options, std::move(params));
}

void AdamW::Step(double lr) {
  ++step_;
  const float b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
  const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(options_.eps);
  for (size_t k = 0; k < params_.size(); ++k) {
    const ParamRef& p = params_[k];
    float* w = p.value.data<float>();
    const float* g = p.grad.data<float>();
    float* m = m_[k].data<float>();
    float* v = v_[k].data<float>();
    const float decay =
        p.weight_decay ? static_cast<float>(1.0 - lr * options_.weight_decay) : 1.0f;
    ThreadPool::Default().ParallelFor(p.value.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] = w[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
      }
    });
  }
}

void AdamW::ZeroGrad() {
  for (const ParamRef& p : params_) {
    float* g = p.grad.data<float>();
    std::fill(g, g + p.grad.numel(), 0.0f);
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW::StateTensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t k = 0; k < params_.size(); ++k) {
    out.emplace_back("adamw.m/" + params_[k].name, m_[k]);
    out.emplace_back("adamw.v/" + params_[k].name, v_[k]);
  }
  return out;
}

Status AdamW::LoadState(const std::map<std::string, Tensor>& tensors, int64_t step) {
  for (size_t k = 0; k < params_.size(); ++k) {
    for (auto [prefix, dst] : {std::pair{"adamw.m/", &m_[k]}, std::pair{"adamw.v/", &v_[k]}}) {
      const std::string key = prefix + params_[k].name;
      auto it = tensors.find(key);
      if (it == tensors.end()) return DataLossError("optimizer state lacks " + key);
      if (it->second.dtype() != DType::kF32 || it->second.shape() != dst->shape()) {
        return DataLossError("optimizer state " + key + " has shape " +
                             ShapeToString(it->second.shape()) + ", expected " +
                             ShapeToString(dst->shape()));
      }
      ORRERY_RETURN_IF_ERROR(dst->CopyFrom(it->second));
    }
  }
  if (step < 0) return DataLossError("optimizer step is negative");
  step_ = step;
  return Status::OK();
}

double GlobalGradNorm(const std::vector<ParamRef>& params) {
  double sum = 0;
  for (const ParamRef& p : params) {
    const float* g = p.grad.data<float>();
    for (int64_t i = 0; i < p.grad.numel(); ++i) sum += static_cast<double>(g[i]) * g[i];
  }
  return std::sqrt(sum);
}

double ClipGradGlobalNorm(const std::vector<ParamRef>& params, double max_norm) {
  const double norm = GlobalGradNorm(params);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-12));
    for (const ParamRef& p : params) {
      float* g = p.grad.data<float>();
      for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] *= scale;
    }
  }
  return norm;
}

}  // namespace orrery
