// A trainable parameter as the optimizer sees it: the value, its gradient and whether weight
// decay applies. Models hand these out; the tensors share storage with the model's own, so the
// optimizer updates the model in place.
#pragma once

#include <string>

#include "core/tensor.h"

namespace orrery {

struct ParamRef {
  std::string name;          // unique, stable across runs (checkpoint keys)
  Tensor value;              // f32, CPU
  Tensor grad;               // f32, same shape; accumulated by backward passes
  bool weight_decay = true;  // false for norms, biases, gates, A_log, dt_bias, AttnRes queries
};

}  // namespace orrery
