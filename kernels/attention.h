// Causal softmax attention per document on Tensors: the core of the GPU model's gated MLA layer
// (spec §3.1-3.2), dispatched by device. The CPU path runs the CausalAttentionForward/Backward
// templates of kernels/mla_attention.h (the CPU model's core and this op's twin); the CUDA path
// runs flash-attention style kernels that stream key tiles through an online softmax and never
// hold an [N, N] score matrix: on tensor cores for bf16 inputs with head dims 192/128 or 128/128
// (bf16 products with f32 accumulation, P and dS rounded to bf16; on Hopper
// kernels/cuda/attention_forward_wgmma.cu, attention_backward_dq_wgmma.cu and
// attention_backward_dkdv_wgmma.cu, wgmma with TMA loads and warp specialisation, else
// attention_forward_tc.cu and attention_backward_tc.cu on mma.sync), else in f32 on SIMT cores
// (attention_forward.cu, attention_backward.cu). The environment variable
// ORRERY_ATTENTION=wgmma|mma|simt forces one kernel set where it takes the inputs (the next one
// down elsewhere), here and in PrefixCausalAttention, so that benchmarks and bisections can A/B
// them; another value is an error.
//
// Layouts (N packed tokens, H heads): q, k [N, H, dqk]; v, o [N, H, dv]; lse [N, H], the natural
// log-sum-exp of each row's scaled scores, saved by the forward so that the backward recomputes
// the probabilities instead of storing them. cu_seqlens (i64 [docs + 1] on q's device: 0 =
// cu[0] <= cu[1] <= ... <= cu[docs] = N, empty documents allowed) delimits the documents: token
// i of document [cu[d], cu[d+1]) attends to the tokens cu[d] .. i.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

// The largest dqk and dv the CUDA kernels take (the model's are 192 and 128).
inline constexpr int64_t kMaxAttentionHeadDimCuda = 256;

// o = softmax(scale q k^T, causal within documents) v per head. q, k, v: f32 or f64 on cpu, bf16
// or f32 on cuda (one dtype); o like v and lse [N, H] (q's dtype on cpu, f32 on cuda), each
// allocated when undefined, else checked and overwritten. On cuda the values of cu_seqlens are
// trusted (reading them back would synchronise the stream); on cpu they are checked.
Status CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                       double scale, Tensor* o, Tensor* lse);

// The gradients of CausalAttention: o and lse as it returned them, d_o like o. dq, dk, dv like
// q, k, v (allocated when undefined, overwritten). Deterministic on both devices (no atomics).
Status CausalAttentionGrad(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                           const Tensor& lse, const Tensor& d_o, const Tensor& cu_seqlens,
                           double scale, Tensor* dq, Tensor* dk, Tensor* dv);

// Prefix-causal attention forward: chunked prefill against a cached context (the GPU inference
// engine's MHA-form prefill, model/gpu/gpu_inference.h). Queries and keys are packed with their
// own offsets: document d has the n_d = cu_q[d+1] - cu_q[d] queries q[cu_q[d] ..] and the L_d =
// cu_k[d+1] - cu_k[d] keys and values k, v[cu_k[d] ..] of its whole context, the queries being
// its last n_d positions (n_d <= L_d): query i of the document (0-based) attends to keys 0 ..
// L_d - n_d + i. With cu_q == cu_k (and k, v the queries' own) it is CausalAttention.
// q [Nq, H, dqk], k [Nk, H, dqk], v [Nk, H, dv], one dtype (as CausalAttention); cu_q and cu_k
// i64 [docs + 1] on q's device (0 = cu[0] <= ... <= cu[docs] = Nq resp. Nk); o [Nq, H, dv] like v
// and lse [Nq, H] (q's dtype on cpu, f32 on cuda), allocated when undefined, else checked and
// overwritten. On cpu the offsets are checked (n_d <= L_d included); on cuda they are trusted,
// and a query that sees no key (n_d > L_d) gets o = 0 and lse = -inf. CUDA: the kernels of
// CausalAttention's forward with a per-query key range (tensor cores for bf16 192/128 and
// 128/128, else SIMT).
Status PrefixCausalAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                             const Tensor& cu_k, double scale, Tensor* o, Tensor* lse);

// The offsets' values for PrefixCausalAttention, from host copies (i64 [docs + 1] on the cpu):
// one count of documents, rising from 0 to q_tokens and k_tokens, n_d <= L_d. One InvalidArgument
// line for the first bad value. The op runs it on cpu; a caller whose offsets live on the GPU
// checks its host copies with it before uploading them.
Status CheckPrefixOffsets(const Tensor& cu_q, const Tensor& cu_k, int64_t q_tokens,
                          int64_t k_tokens);

}  // namespace orrery::kernels
