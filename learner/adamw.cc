#include "learner/adamw.h"

#include <cmath>
#include <set>

#include "core/thread_pool.h"
#include "kernels/adamw_op.h"

namespace orrery {

AdamW::AdamW(AdamWOptions options, std::vector<ParamRef> params, std::vector<Tensor> m,
             std::vector<Tensor> v, Device device)
    : options_(options),
      params_(std::move(params)),
      m_(std::move(m)),
      v_(std::move(v)),
      device_(device) {}

StatusOr<AdamW> AdamW::Create(AdamWOptions options, std::vector<ParamRef> params) {
  std::set<std::string> names;
  const Device device = params.empty() ? Device::Cpu() : params.front().value.device();
  for (const ParamRef& p : params) {
    if (!names.insert(p.name).second) {
      return InvalidArgumentError("optimizer: parameter name '" + p.name + "' appears twice");
    }
    if (!p.value.defined() || !p.grad.defined() || p.value.dtype() != DType::kF32 ||
        p.grad.dtype() != DType::kF32 || !(p.value.device() == device) ||
        !(p.grad.device() == device) || p.value.shape() != p.grad.shape()) {
      return InvalidArgumentError("optimizer: parameter '" + p.name +
                                  "' needs f32 value and gradient of one shape on " +
                                  device.ToString() + " (where the first parameter is)");
    }
    if (p.compute.defined() &&
        (p.compute.dtype() != DType::kBF16 || device.is_cpu() || !(p.compute.device() == device) ||
         p.compute.shape() != p.value.shape())) {
      return InvalidArgumentError("optimizer: parameter '" + p.name +
                                  "': its compute copy must be bf16 of its shape on its device");
    }
  }
  if (options.beta1 < 0 || options.beta1 >= 1 || options.beta2 < 0 || options.beta2 >= 1 ||
      options.eps <= 0 || options.weight_decay < 0) {
    return InvalidArgumentError("optimizer: betas must be in [0, 1), eps > 0, weight_decay >= 0");
  }
  std::vector<Tensor> m, v;
  for (const ParamRef& p : params) {
    for (std::vector<Tensor>* moments : {&m, &v}) {
      if (device.is_cpu()) {
        moments->push_back(Tensor::Zeros(p.value.shape(), DType::kF32));
        continue;
      }
      ORRERY_ASSIGN_OR_RETURN(Tensor t, Tensor::Allocate(p.value.shape(), DType::kF32, device));
      ORRERY_RETURN_IF_ERROR(t.SetZero());
      moments->push_back(std::move(t));
    }
  }
  return AdamW(options, std::move(params), std::move(m), std::move(v), device);
}

Status AdamW::Step(double lr) {
  ++step_;
  if (on_device()) {  // every parameter in one launch
    kernels::AdamWStepArgs args;
    args.lr = lr;
    args.beta1 = options_.beta1;
    args.beta2 = options_.beta2;
    args.eps = options_.eps;
    args.weight_decay = options_.weight_decay;
    args.step = step_;
    std::vector<kernels::AdamWTensors> items;
    items.reserve(params_.size());
    for (size_t k = 0; k < params_.size(); ++k) {
      const ParamRef& p = params_[k];
      items.push_back({p.grad, p.value, m_[k], v_[k], p.compute, p.weight_decay});
    }
    ORRERY_RETURN_IF_ERROR(kernels::AdamWStepMany(args, grad_factor_, &items));
    grad_factor_ = Tensor();
    return Status::OK();
  }
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
  return Status::OK();
}

Status AdamW::ZeroGrad() {
  grad_factor_ = Tensor();
  if (on_device()) {  // every gradient in one launch
    std::vector<Tensor> grads;
    for (const ParamRef& p : params_) grads.push_back(p.grad);
    return kernels::ZeroMany(&grads);
  }
  for (const ParamRef& p : params_) {
    float* g = p.grad.data<float>();
    std::fill(g, g + p.grad.numel(), 0.0f);
  }
  return Status::OK();
}

StatusOr<double> AdamW::ClipGradNorm(double max_norm) {
  if (!on_device()) return ClipGradGlobalNorm(params_, max_norm);
  std::vector<Tensor> grads;
  for (const ParamRef& p : params_) grads.push_back(p.grad);
  Tensor sumsq;
  ORRERY_RETURN_IF_ERROR(kernels::SquaredNorm(grads, &sumsq));
  grad_factor_ = Tensor();
  ORRERY_RETURN_IF_ERROR(kernels::ClipFactor(sumsq, max_norm, &grad_factor_));
  ORRERY_ASSIGN_OR_RETURN(Tensor host, sumsq.To(Device::Cpu()));
  return std::sqrt(host.data<double>()[0]);
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
