// The CUDA halves of the Tensor-level ops in kernels/*.h. Callers (the dispatchers in kernels/)
// have checked shapes, dtypes and devices; these only launch. Every function queues on the
// device context's stream (device_context.h) and returns the launch's or library's error.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/adamw_op.h"
#include "kernels/lm_head_policy_loss.h"
#include "kernels/matmul.h"
#include "kernels/policy_token_terms.h"
#include "kernels/situ.h"

namespace orrery::kernels {
struct PagedLatentCache;  // kernels/mla_decode.h
}  // namespace orrery::kernels

namespace orrery::kernels::cuda {

// One token per row of logits (kernels/token_sampling.h).
Status SampleTokensCuda(const Tensor& logits, const Tensor& params, Tensor* ids, Tensor* logprobs);

// c = alpha op(a) op(b) + beta c through cuBLASLt (kernels/matmul.h).
Status MatmulCuda(const Tensor& a, const Tensor& b, const MatmulOptions& o, int64_t m, int64_t n,
                  int64_t k, Tensor* c);
// The strided-batched form (kernels/matmul.h), one cuBLASLt call.
Status MatmulStridedBatchedCuda(const MatrixBatch& a, const MatrixBatch& b, int64_t batch,
                                const MatmulOptions& o, int64_t m, int64_t n, int64_t k,
                                const MatrixBatch& c);

// RMSNorm over rows of x [rows, d] (bf16 or f32); w [d] of x's dtype or undefined; y like x;
// rstd [rows] f32.
Status RmsNormForwardCuda(const Tensor& x, const Tensor& w, double eps, Tensor* y, Tensor* rstd);
// dx (x's dtype) overwritten; dw [d] f32 accumulated when defined.
Status RmsNormBackwardCuda(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                           Tensor* dx, Tensor* dw);

// Causal attention per document (kernels/attention.h): q, k [N, H, dqk], v [N, H, dv] of one dtype
// (bf16 or f32), dims <= 256; cu_seqlens i64 [docs + 1] on the device; o like v, lse [N, H] f32.
// The kernel sets (attention_tc.h), each used where it takes the inputs, else the next one down:
//   kWgmma: the Hopper kernels (wgmma, TMA, warp specialisation; bf16, head dims 192/128 or
//     128/128, sm_90), forward and backward.
//   kMma: the mma.sync tensor-core kernels (bf16, head dims 192/128 or 128/128).
//   kSimt: the f32-arithmetic SIMT kernels (every dtype and dim), the reference the tests and
//     benchmarks compare the tensor-core ones with.
// kFastest is kWgmma. The op (attention_op.cc) passes the set ORRERY_ATTENTION names.
enum class AttentionKernels { kFastest, kWgmma, kMma, kSimt };
Status CausalAttentionForwardCuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& cu_seqlens, double scale, Tensor* o, Tensor* lse,
                                  AttentionKernels kernels = AttentionKernels::kFastest);
// dq, dk, dv (like q, k, v) overwritten.
Status CausalAttentionBackwardCuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& o, const Tensor& lse, const Tensor& d_o,
                                   const Tensor& cu_seqlens, double scale, Tensor* dq, Tensor* dk,
                                   Tensor* dv,
                                   AttentionKernels kernels = AttentionKernels::kFastest);
// Prefix-causal attention (kernels/attention.h PrefixCausalAttention): q [Nq, H, dqk], k
// [Nk, H, dqk], v [Nk, H, dv], cu_q and cu_k i64 [docs + 1] on the device; o [Nq, H, dv] like v,
// lse [Nq, H] f32. The same kernels as the causal forward, with their PrefixRows row map.
Status PrefixCausalAttentionForwardCuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& cu_q, const Tensor& cu_k, double scale,
                                        Tensor* o, Tensor* lse,
                                        AttentionKernels kernels = AttentionKernels::kFastest);

// Gated activations (kernels/situ.h) element-wise over tensors of one dtype (bf16 or f32).
Status GluForwardCuda(const GluActivation& act, const Tensor& a, const Tensor& u, Tensor* h);
Status GluBackwardCuda(const GluActivation& act, const Tensor& a, const Tensor& u, const Tensor& dh,
                       Tensor* da, Tensor* du);

// sumsq (f64 [1], overwritten) = sum over tensors of sum x^2 (f32 tensors), in a fixed order.
Status SquaredNormCuda(const std::vector<Tensor>& xs, Tensor* sumsq);
// factor (f32 [1]) = max_norm / (norm + 1e-12) when norm > max_norm > 0, else 1.
Status ClipFactorCuda(const Tensor& sumsq, double max_norm, Tensor* factor);
// AdamW over many parameters in one launch, and zeroing many tensors in one launch
// (kernels/adamw_op.h; checked by the caller).
Status AdamWStepManyCuda(const AdamWStepArgs& args, const Tensor& grad_factor,
                         const std::vector<AdamWTensors>& items);
Status ZeroManyCuda(const std::vector<Tensor>& xs);
// One AdamW update of one parameter (kernels/adamw_op.h).
Status AdamWStepCuda(const AdamWStepArgs& args, const Tensor& grad, const Tensor& grad_factor,
                     Tensor* param, Tensor* m, Tensor* v, Tensor* param_bf16);

// Embedding (kernels/embedding.h): table/y bf16 or f32; dtable f32. Both fail with OutOfRange for
// an id outside [0, V) (one 4-byte flag read back).
Status EmbeddingGatherCuda(const Tensor& table, const Tensor& ids, bool check_ids, Tensor* y);
Status EmbeddingScatterAddCuda(const Tensor& ids, const Tensor& dy, Tensor* dtable);

// The cross-entropy of a chunk of f32 logits rows (kernels/lm_head_loss.h): adds each row's
// mask-weighted loss into acc (f64 [1]); with `backward` writes dz = scale m (softmax - onehot)
// into *dz (the logits themselves, f32, or a bf16 buffer of their shape). A target outside
// [0, V) keeps its global row (row0 + r) in flag (atomicMin).
Status RowsCrossEntropyCuda(const Tensor& logits, const Tensor& targets, const Tensor& mask,
                            float scale, bool backward, int64_t row0, Tensor* dz, Tensor* acc,
                            Tensor* flag);
// acc zeroed and flag cleared, on `device`.
Status LossAccumulatorsCuda(Device device, Tensor* acc, Tensor* flag);
// Reads acc into *loss_sum, or returns OutOfRange for the flagged target.
Status ReadLossCuda(const Tensor& acc, const Tensor& flag, const Tensor& targets, int64_t vocab,
                    double* loss_sum);

// The policy-loss rows of a chunk of f32 logits (kernels/lm_head_policy_loss.h), one block per
// row: log π and entropy of the logits times inv_temperature into *logp / *entropy (undefined:
// not written); with `loss` the token terms added into acc (f64 [7], PolicyRowSums' order); with
// `backward` dz = scale (d loss / d z) into *dz (the logits, f32, or a bf16 buffer of their
// shape). A masked row's target outside [0, V) keeps its global row (row0 + r) in flag.
struct PolicyRowsArgs {
  PolicyTokenCoefficients coef;
  float inv_temperature = 1.0f;
  double scale = 1.0;  // grad_scale / T
  bool loss = false, backward = false;
  int64_t row0 = 0;
};
Status RowsPolicyLossCuda(const Tensor& logits, const PolicyRows& rows, const PolicyRowsArgs& args,
                          Tensor* dz, Tensor* logp, Tensor* entropy, Tensor* acc, Tensor* flag);

// MLA keys and values from the latent up-projection (kernels/mla_keys.h), bf16 or f32.
Status MlaKeysValuesCuda(const Tensor& kv, const Tensor& kr, int64_t dn, Tensor* k, Tensor* v);
Status MlaKeysValuesGradCuda(const Tensor& dk, const Tensor& dv, int64_t dn, Tensor* dkv,
                             Tensor* dkr);
// The KDA short conv + SiLU (kernels/short_conv.h): x, w, dy, y, dx bf16 or f32 (one dtype),
// cu_seqlens i64 on the device (checked by the caller); dw [C, W] f32 accumulated.
Status ShortConvSiluForwardCuda(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                                Tensor* y);
Status ShortConvSiluDecodeCuda(const Tensor& x, const Tensor& w, const Tensor& rows, Tensor* hist,
                               Tensor* y);
Status ShortConvSiluBackwardCuda(const Tensor& x, const Tensor& w, const Tensor& cu_seqlens,
                                 const Tensor& dy, Tensor* dx, Tensor* dw);

// Block AttnRes mixing (kernels/attn_res.h): sources, w, gamma, h of one dtype (bf16 or f32), at
// most kAttnResMaxSourcesCuda sources; p [rows, n] f32 or undefined (not saved).
constexpr int kAttnResMaxSourcesCuda = 128;
Status AttnResMixCuda(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                      double eps, Tensor* h, Tensor* p);
// d_sources entries undefined (skipped) or f32 [rows, d] accumulated; dw, dgamma f32 accumulated.
Status AttnResMixGradCuda(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                          double eps, const Tensor& p, const Tensor& dh,
                          const std::vector<Tensor>& d_sources, Tensor* dw, Tensor* dgamma);

// Element-wise gates and helpers (kernels/gates.h), on bf16 or f32 tensors.
Status SigmoidGateForwardCuda(const Tensor& x, const Tensor& z, Tensor* y);
Status SigmoidGateBackwardCuda(const Tensor& x, const Tensor& z, const Tensor& dy, Tensor* dx,
                               Tensor* dz);
// y (x's dtype or f32) = sigmoid(x).
Status SigmoidCuda(const Tensor& x, Tensor* y);
// y += alpha x: one dtype, or x bf16 into an f32 y.
Status AddIntoCuda(const Tensor& x, float alpha, Tensor* y);
// y = x converted (f32 / bf16 either way; the same dtype copies).
Status CastIntoCuda(const Tensor& x, Tensor* y);
// y [rows, cols] += b per row (b of y's dtype); db f32 [cols] += column sums of dy (bf16 or f32).
Status AddRowBiasCuda(const Tensor& b, Tensor* y);
Status RowBiasGradCuda(const Tensor& dy, Tensor* db);

// The paged latent cache of MLA decode (kernels/mla_decode.h), bf16 or f32, checked by the caller:
// the latents' rows copied into their slots; the absorbed decode with `splits` splits of each
// context (0: chosen from the batch, the capacity and the SM count; else at most
// kMaxMlaDecodeSplits).
Status PagedLatentWriteCuda(const Tensor& latents, const Tensor& slot_mapping, Tensor* pages);
Status MlaDecodePagedCuda(const Tensor& q, const PagedLatentCache& cache, int64_t dv, float scale,
                          int splits, Tensor* o, Tensor* lse);

// The ops' fixed-order cross-block reduction (column_sums.h) on tensors, for tests: parts
// [rows, cols] and out [cols], both f32 or both f64 on one device.
Status ColumnSumsCuda(const Tensor& parts, bool accumulate, Tensor* out);

}  // namespace orrery::kernels::cuda
