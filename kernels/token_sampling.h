// SampleTokens: one next token drawn per row of logits, where the logits are — the rollout
// engine's sampling on the GPU (rollout/sampling.h states the rule; the GPU backend samples on
// the device and copies out only ids and behaviour log-probabilities, not [rows, V] logits).
//
// Row i has a temperature T (>= 0), a top_p in (0, 1] and a uniform number u in [0, 1), drawn by
// the caller from its own stream (the agent loop's per-episode Philox stream), so a seed
// reproduces an episode whichever side samples. With m = max_j z_j, t = T (1 when T = 0) and
// p_j = exp((z_j - m) / t) in f64:
//   logprob = (z_id - m) / t - log(sum_j p_j): log softmax(z / T)[id], the behaviour policy's,
//       whatever top_p restricts (T = 0: the temperature-1 log-probability);
//   T = 0: id = the first j with z_j = m (greedy, lowest id on ties);
//   top_p = 1: id = the first j, in id order, whose running sum of p reaches u * sum_j p_j;
//   top_p < 1: the nucleus is the shortest prefix of the ids sorted by p descending (ties by
//       ascending id) whose mass reaches top_p * sum_j p_j; id = the first of that order whose
//       running sum reaches u * (the nucleus's mass). When rounding leaves a running sum short
//       of its bound, the last candidate is taken (the nucleus is then everything).
// How: the nucleus's cut and the draw are found without sorting, by a radix descent over the
// bit patterns of the p_j (positive doubles order like their bits): 16 passes of 4-bit digits,
// each summing the mass and counting the candidates per digit, keep the digit where the
// running mass reaches the bound; ties at the final value are resolved by id order. Both
// implementations run that descent (the CPU twin sequentially, the CUDA kernel with fixed-order
// block reductions, so its draws are deterministic). Sums are f64 in other orders than
// SampleToken's loop, so a draw can differ from it only when u lands within rounding (~1e-16
// relative) of a boundary, and log-probabilities agree to ~1e-7.
//
// logits f32 [N, V] (V >= 1); params f64 [N, 3] = (T, top_p, u) per row on the logits' device;
// ids i32 [N] and logprobs f32 [N] on that device (allocated when undefined). On cpu the params
// are checked (one InvalidArgument line); on cuda they are trusted (the caller validated its
// options; reading them back would synchronise the stream).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

Status SampleTokens(const Tensor& logits, const Tensor& params, Tensor* ids, Tensor* logprobs);

}  // namespace orrery::kernels
