// AdamW (Loshchilov & Hutter) with fp32 moment state and decoupled weight decay.
//
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr * wd * p               (only where ParamRef::weight_decay)
//   p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// The update is element-wise, so results do not depend on the thread count. The moment tensors
// and the step count are the optimizer state that checkpoints save and restore.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "learner/param_ref.h"

namespace orrery {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

class AdamW {
 public:
  // Fails unless every parameter is an f32 tensor with a gradient of the same shape, all on the
  // CPU or all on one CUDA device (then the moments live there too and every update runs there,
  // kernels/adamw_op.h), and names are unique.
  static StatusOr<AdamW> Create(AdamWOptions options, std::vector<ParamRef> params);

  // One update with learning rate `lr` from the current gradients (not cleared), scaled by the
  // factor of the last ClipGradNorm when its norm exceeded the limit.
  Status Step(double lr);
  Status ZeroGrad();
  // The global L2 norm of the gradients; when max_norm > 0 and the norm exceeds it, the update
  // of the next Step scales them by max_norm / norm (on the CPU: here, in place, as
  // ClipGradGlobalNorm; on CUDA: a factor that stays on the device).
  StatusOr<double> ClipGradNorm(double max_norm);
  bool on_device() const { return !device_.is_cpu(); }

  int64_t step() const { return step_; }
  const std::vector<ParamRef>& params() const { return params_; }
  const AdamWOptions& options() const { return options_; }

  // "adamw.m/<name>", "adamw.v/<name>" tensors and the step, for checkpoints.
  std::vector<std::pair<std::string, Tensor>> StateTensors() const;
  // Restores the state saved by StateTensors; every tensor must be present with the right shape.
  Status LoadState(const std::map<std::string, Tensor>& tensors, int64_t step);

 private:
  AdamW(AdamWOptions options, std::vector<ParamRef> params, std::vector<Tensor> m,
        std::vector<Tensor> v, Device device);
  AdamWOptions options_;
  std::vector<ParamRef> params_;
  std::vector<Tensor> m_, v_;
  Device device_ = Device::Cpu();
  Tensor grad_factor_;  // CUDA: f32 [1] from ClipGradNorm, applied by the next Step
  int64_t step_ = 0;
};

// The global L2 norm of all gradients, accumulated in f64 in a fixed order (deterministic).
double GlobalGradNorm(const std::vector<ParamRef>& params);
// Scales every gradient by max_norm / norm when norm > max_norm (max_norm <= 0: no clipping).
// Returns the norm before clipping.
double ClipGradGlobalNorm(const std::vector<ParamRef>& params, double max_norm);

}  // namespace orrery
