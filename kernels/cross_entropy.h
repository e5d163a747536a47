// Losses on logits [N, V] (f32 or f64, CPU): masked cross-entropy for pretraining, and per-token
// log-probabilities and entropies (with their backward) for RL objectives. Softmax in double.
#pragma once

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// loss = sum_i m_i * -log softmax(logits_i)[t_i] / sum_i m_i, with targets [N] i32 in [0, V) and
// mask [N] f32 weights (undefined: all ones; a zero weight ignores the row, whatever its target).
// When dlogits is non-null it receives d loss / d logits (logits' dtype and shape). An all-zero
// mask gives loss 0 and zero gradients.
StatusOr<double> MaskedCrossEntropy(const Tensor& logits, const Tensor& targets, const Tensor& mask,
                                    Tensor* dlogits);

// logprobs [N] = log softmax(logits_i)[t_i]; entropy [N] (when non-null) = -sum_j p_ij log p_ij.
// Outputs have the logits' dtype.
Status TokenLogprobs(const Tensor& logits, const Tensor& targets, Tensor* logprobs,
                     Tensor* entropy);

// dlogits = sum over the given upstream gradients: dlogprobs [N] (through logprobs) and dentropy
// [N] (through entropy); either may be undefined.
Status TokenLogprobsBackward(const Tensor& logits, const Tensor& targets, const Tensor& dlogprobs,
                             const Tensor& dentropy, Tensor* dlogits);

}  // namespace orrery::kernels
