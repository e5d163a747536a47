// A trainable parameter as the optimizer sees it: the value, its gradient and whether weight
// decay applies. Models hand these out; the tensors share storage with the model's own, so the
// optimizer updates the model in place.
#pragma once

#include <string>

#include "core/tensor.h"

namespace orrery {

struct ParamRef {
  std::string name;          // unique, stable across runs (checkpoint keys)
  Tensor value;              // f32 master weights, on the CPU or one CUDA device
  Tensor grad;               // f32, same shape and device; accumulated by backward passes
  bool weight_decay = true;  // false for norms, biases, gates, A_log, dt_bias, AttnRes queries
  // Optional bf16 copy of value on its CUDA device, the weights the forward reads (the GPU
  // model's compute copy): the optimizer rewrites it after every update. Undefined: none.
  Tensor compute{};
};

}  // namespace orrery
