// The tensor-core causal attention kernels behind CausalAttentionForwardCuda /
// CausalAttentionBackwardCuda (ops_cuda.h), for the model's head dims, bf16 operands with f32
// accumulation: the Hopper forward on wgmma with TMA loads and warp specialisation
// (attention_forward_wgmma.cu), and the forward and backward on `mma.sync.m16n8k16`
// (attention_forward_tc.cu, attention_backward_tc.cu). Same contract as the SIMT kernels
// (kernels/attention.h); callers have checked the inputs and allocated the outputs.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels::cuda {

// Whether the tensor-core kernels take q [N, H, dqk] and v [N, H, dv]: bf16, with (dqk, dv)
// (192, 128) or (128, 128).
bool AttentionTcSupported(const Tensor& q, const Tensor& v);

// Whether the wgmma kernels take q [Nq, H, dqk], k [Nk, H, dqk], v [Nk, H, dv] with this scale:
// bf16, (dqk, dv) (192, 128) or (128, 128), scale > 0, q, k, v 16-byte aligned (TMA),
// 1 <= Nk, Nq < 2^31 - 256, and the device an sm_90 (Hopper).
bool AttentionWgmmaSupported(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// o and the natural log-sum-exp lse (f32 [N, H]) of causal attention within documents, on wgmma
// (where AttentionWgmmaSupported) or on mma.sync (where AttentionTcSupported). ping_pong = false
// lets the wgmma forward's two consumer warpgroups issue their products independently instead of
// in turns (attention_forward_wgmma.cu), for the benchmark's A/B; the op always takes turns.
Status AttentionForwardWgmma(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& cu_seqlens, double scale, Tensor* o, Tensor* lse,
                             cudaStream_t stream, bool ping_pong = true);
// PrefixCausalAttention's forward (kernels/attention.h) on wgmma, where AttentionWgmmaSupported.
Status PrefixAttentionForwardWgmma(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& cu_q, const Tensor& cu_k, double scale, Tensor* o,
                                   Tensor* lse, cudaStream_t stream);
Status AttentionForwardTc(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& cu_seqlens, double scale, Tensor* o, Tensor* lse,
                          cudaStream_t stream);

// PrefixCausalAttention's forward (kernels/attention.h): q [Nq, H, dqk], k [Nk, H, dqk], v
// [Nk, H, dv], queries and keys packed by cu_q and cu_k (i64 [docs + 1] each, on the device).
Status PrefixAttentionForwardTc(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_q, const Tensor& cu_k, double scale, Tensor* o,
                                Tensor* lse, cudaStream_t stream);

// dq, dk, dv given dsum = rowsum(dO * O) (f32 [N, H], the backward's preprocess) and the forward's
// lse; deterministic (each output element written once by one thread, no atomics). On mma.sync.
Status AttentionBackwardTc(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                           const Tensor& dsum, const Tensor& d_o, const Tensor& cu_seqlens,
                           double scale, Tensor* dq, Tensor* dk, Tensor* dv, cudaStream_t stream);

// The same on wgmma, where AttentionWgmmaSupported and d_o is 16-byte aligned, as two passes:
// dq (attention_backward_dq_wgmma.cu) and dk, dv (attention_backward_dkdv_wgmma.cu).
Status AttentionDqWgmma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                        const Tensor& dsum, const Tensor& d_o, const Tensor& cu_seqlens,
                        double scale, Tensor* dq, cudaStream_t stream);
Status AttentionDkDvWgmma(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                          const Tensor& dsum, const Tensor& d_o, const Tensor& cu_seqlens,
                          double scale, Tensor* dk, Tensor* dv, cudaStream_t stream);

}  // namespace orrery::kernels::cuda
