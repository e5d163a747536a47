// The optimizer step as Tensor-level ops, so that it runs where the parameters live: the squared
// global gradient norm, the clipping factor, and one AdamW update per parameter. The CPU twin
// computes what learner/adamw.h computes (the same formula and f32 rounding order).
//
//   m <- b1 m + (1 - b1) f g;  v <- b2 v + (1 - b2) (f g)^2      (f: the clipping factor)
//   p <- p (1 - lr wd) - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//
// Master weights, gradients and moments are f32; on CUDA an optional bf16 tensor receives the
// updated weights rounded (the compute copy). Nothing here synchronises with the host: the norm
// and the factor stay in device memory until a caller reads them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

struct AdamWStepArgs {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0;  // 0 for parameters without decay
  int64_t step = 1;         // t, counted from 1
};

// sumsq: f64 [1] on the tensors' device, overwritten with sum_i sum(x_i^2); every x_i f32 on one
// device. Allocated when undefined.
Status SquaredNorm(const std::vector<Tensor>& xs, Tensor* sumsq);
// factor: f32 [1] on sumsq's device, max_norm / (norm + 1e-12) when the norm sqrt(sumsq)
// exceeds max_norm, else 1 (and 1 when max_norm <= 0: no clipping), as learner/adamw.cc clips.
// Allocated when undefined.
Status ClipFactor(const Tensor& sumsq, double max_norm, Tensor* factor);
// Updates param, m, v in place (all f32, grad's shape); grad_factor f32 [1] or undefined (1);
// param_bf16 (CUDA only, may be null or undefined) receives bf16(param).
Status AdamWStep(const AdamWStepArgs& args, const Tensor& grad, const Tensor& grad_factor,
                 Tensor* param, Tensor* m, Tensor* v, Tensor* param_bf16);

// One parameter of AdamWStepMany: the tensors of AdamWStep (param_bf16 undefined for none), and
// whether args.weight_decay applies to it (else 0).
struct AdamWTensors {
  Tensor grad, param, m, v, param_bf16;
  bool decay = true;
};
// AdamWStep for every item (all on one device): one launch on CUDA over a table of the tensors
// in fixed-size chunks (a model's thousands of parameters, e.g. per-expert views, cost one launch
// instead of one each); the CPU twin loops AdamWStep. Each item's result equals AdamWStep's.
Status AdamWStepMany(const AdamWStepArgs& args, const Tensor& grad_factor,
                     std::vector<AdamWTensors>* items);
// Sets every tensor (f32, one device) to zero: one launch on CUDA.
Status ZeroMany(std::vector<Tensor>* xs);

}  // namespace orrery::kernels
