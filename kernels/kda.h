// Kimi Delta Attention (KDA): the op interface shared by the CPU reference and the CUDA kernels.
//
// Maths: ../shared/spec/model.md §2 (docs/model.md in this repository records deviations).
// Layouts follow fla's chunk_kda (so `orrery ops run --op kda` is comparable with fla):
//   q, k   [B, T, H, K]   already L2-normalised (the layer does the norm; see KdaL2Norm*)
//   v      [B, T, H, V]
//   g      [B, T, H, K]   log-decay in natural log, already activated (<= 0)
//   beta   [B, T, H]      after the sigmoid
//   initial_state [N, H, K, V] f32, optional (N = B, or the number of sequences with cu_seqlens);
//                 f64 is accepted too when the other inputs are f64 (gradient checks)
//   cu_seqlens    [N + 1] i64, optional: packed variable-length sequences; then B must be 1 and the
//                 state (and the short conv in the layer) restart at each boundary.
// Outputs: o [B, T, H, V] (dtype of v) and final_state [N, H, K, V] f32 (f64 for f64 inputs).
//
// Dispatch is by device: CPU tensors (f32 or f64; f64 is for gradient checks) run the reference in
// kernels/cpu, CUDA tensors run kernels/cuda (CUDA builds only).
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

enum class KdaAlgorithm {
  kRecurrent,  // token by token (spec §2.3): the gold oracle
  kChunked,    // WY/UT chunked form (spec §2.4) with chunk_size tokens per chunk
};

enum class KdaGateKind {
  kBounded,   // g = g_min * sigmoid(exp(A_log) * (z + dt_bias)), g in (g_min, 0)   (K3)
  kOriginal,  // g = -exp(A_log) * softplus(z + dt_bias)                           (Kimi Linear)
};

// What the op computes from raw inputs before the recurrence (fla's use_qk_l2norm_in_kernel,
// use_beta_sigmoid_in_kernel, use_gate_in_kernel). With a transform on, the matching input is the
// raw one and the gradients are with respect to it: q and k before their L2 norm, beta the logit
// before the sigmoid, g the gate's pre-activation z (with KdaInputs::a_log and dt_bias, either
// optional, as KdaGateForward takes them; KdaGrads::da_log / ddt_bias). The CPU applies the
// reference functions below; CUDA applies them in one elementwise pass before the recurrence and
// one after the backward (g then reaches the chunk kernels in f32).
struct KdaInputTransforms {
  bool qk_l2norm = false;  // q, k <- x (sum x^2 + l2norm_eps)^-1/2 over K
  float l2norm_eps = 1e-6f;
  bool beta_sigmoid = false;  // beta <- sigmoid(beta)
  bool gate = false;          // g <- KdaGateForward(g, a_log, dt_bias, gate_kind, gate_lower_bound)
  KdaGateKind gate_kind = KdaGateKind::kBounded;
  float gate_lower_bound = -5.0f;

  bool any() const { return qk_l2norm || beta_sigmoid || gate; }
};

struct KdaOptions {
  KdaAlgorithm algorithm = KdaAlgorithm::kChunked;
  int chunk_size = 64;  // 16, 32 or 64
  float scale = 0.0f;   // <= 0 means K^-1/2
  bool output_final_state = true;
  // Keep the forward's intermediates in KdaOutputs::saved so that KdaBackward on the same inputs
  // skips its recompute of them: a memory-for-time trade the caller makes per call. Only the
  // CUDA tensor-core path keeps anything (its 64-token chunk intermediates and the state at each
  // chunk start, bf16: about 1.8 KB per token-head at K = V = 128); elsewhere `saved` stays
  // empty and the backward recomputes, as it does without it.
  bool keep_for_backward = false;
  KdaInputTransforms transforms;
};

struct KdaInputs {
  Tensor q, k, v, g, beta;
  Tensor initial_state;  // optional (undefined = zeros)
  Tensor cu_seqlens;     // optional
  // With transforms.gate only, both optional: A_log [H] and dt_bias [H * K], f32 (f64 with f64
  // inputs), on q's device.
  Tensor a_log{}, dt_bias{};
};

// Intermediates a forward kept for the backward (opaque; see KdaOptions::keep_for_backward).
struct KdaSaved;

struct KdaOutputs {
  Tensor o;
  Tensor final_state;                     // defined when options.output_final_state
  std::shared_ptr<const KdaSaved> saved;  // set when options.keep_for_backward
};

// Forward. Allocates outputs on the inputs' device.
Status KdaForward(const KdaInputs& in, const KdaOptions& options, KdaOutputs* out);

struct KdaGrads {
  Tensor dq, dk, dv, dg, dbeta;
  Tensor dinitial_state;        // defined when in.initial_state is
  Tensor da_log{}, ddt_bias{};  // defined when transforms.gate and in.a_log / in.dt_bias are
};

// Backward: gradients of every input given do [B,T,H,V] and, optionally, dfinal_state [N,H,K,V]
// (undefined = zeros). Nothing from the forward is needed: per chunk the state at its start is
// recomputed (chunked), or per 64-token segment the states are re-run (recurrent). `saved`, from
// a forward of these same inputs with keep_for_backward, lets the CUDA tensor-core path skip that
// recompute (a `saved` for another problem shape is rejected; one for other values of the same
// shape cannot be told apart, so it must come from these inputs). Gradients have the dtype of
// their input (dinitial_state: f32, or f64 for f64 inputs).
Status KdaBackward(const KdaInputs& in, const Tensor& d_o, const Tensor& d_final_state,
                   const KdaOptions& options, KdaGrads* grads, const KdaSaved* saved = nullptr);

// Gate activation (spec §2.2). z [.., H, K] pre-activation logits; a_log [H] and dt_bias [H*K]
// are optional (undefined: A = 0, i.e. e^A = 1, and b = 0); all of z's dtype (f32 or f64, CPU).
// g_min (< 0) is used by the bounded kind only. g has z's shape.
Status KdaGateForward(const Tensor& z, const Tensor& a_log, const Tensor& dt_bias, KdaGateKind kind,
                      float g_min, Tensor* g);
// Gradients of the gate w.r.t. z, a_log and dt_bias given dg; da_log / ddt_bias are set only
// when a_log / dt_bias are defined (summed over the leading dims of z).
Status KdaGateBackward(const Tensor& z, const Tensor& a_log, const Tensor& dt_bias,
                       KdaGateKind kind, float g_min, const Tensor& dg, Tensor* dz, Tensor* da_log,
                       Tensor* ddt_bias);

// q/k L2 normalisation over the last dimension (spec §2.1 step 3): y = x * rstd with
// rstd = (sum x^2 + eps)^-1/2 per row. y has x's shape, rstd x's shape without the last dim.
Status KdaL2NormForward(const Tensor& x, float eps, Tensor* y, Tensor* rstd);
// dx = rstd * (dy - y <y, dy>), from the forward's y and rstd.
Status KdaL2NormBackward(const Tensor& y, const Tensor& rstd, const Tensor& dy, Tensor* dx);

// Decode: advances N sequences by one token each, state [N, H, K, V] f32 updated in place.
// q, k [N, H, K] (L2-normalised), v [N, H, V], g [N, H, K], beta [N, H]; o [N, H, V].
Status KdaDecodeStep(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta, float scale, Tensor* state, Tensor* o);

// The decode step of an inference engine, whose sequences are rows of a state table and whose
// inputs come straight from the layer's projections:
//   transforms: q, k, g and beta are the raw inputs of these KdaInputTransforms (as KdaForward
//       applies them; a_log [H] and dt_bias [H * K] f32 with transforms.gate, each optional);
//       the CUDA kernel applies them in f32 as it loads (no pass of its own, no rounding of the
//       transformed inputs to bf16), the CPU twin by the reference functions of kda_transforms.h;
//   rows: i32 [N] on the inputs' device, or undefined. Given, state is a table [S, H, K, V] and
//       sequence n's state is its row rows[n], read and written in place (no gather and scatter
//       of the rows around the step); rows must be distinct. A negative row is padding: its
//       output is computed from a zero state and no state is written. On cpu a row >= S is an
//       InvalidArgument error; on cuda rows are not checked.
struct KdaDecodeOptions {
  float scale = 0.0f;  // <= 0 means K^-1/2
  KdaInputTransforms transforms;
  Tensor a_log{}, dt_bias{};
  Tensor rows{};
};
Status KdaDecodeStep(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta, const KdaDecodeOptions& options, Tensor* state, Tensor* o);

}  // namespace orrery::kernels
