// Token cross-entropy over logits with ignored positions, and its gradient.
//
//   loss_sum = sum over positions i with target t_i >= 0 of  logsumexp(z_i) - z_i[t_i]
//   dlogits_i = grad_scale * (softmax(z_i) - onehot(t_i))   (zero where t_i < 0)
// Rows are independent (computed in parallel); the sum is taken over rows in order, so the result
// does not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "learner/trainable_model.h"

namespace orrery {

// logits: [N, V] f32 on the CPU; targets: N ids (-1: ignored). When dlogits is non-null it is
// filled with an [N, V] f32 tensor.
StatusOr<LossSum> CrossEntropy(const Tensor& logits, const std::vector<int32_t>& targets,
                               double grad_scale, Tensor* dlogits);

}  // namespace orrery
