// The tensor-core causal attention kernels (attention_forward_tc.cu, attention_backward_tc.cu)
// behind CausalAttentionForwardCuda / CausalAttentionBackwardCuda (ops_cuda.h): bf16 operands on
// `mma.sync.m16n8k16` with f32 accumulation, for the model's head dims. Same contract as the SIMT
// kernels (kernels/attention.h); callers have checked the inputs and allocated the outputs.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels::cuda {

// Whether the tensor-core kernels take q [N, H, dqk] and v [N, H, dv]: bf16, with (dqk, dv)
// (192, 128) or (128, 128).
bool AttentionTcSupported(const Tensor& q, const Tensor& v);

// o and the natural log-sum-exp lse (f32 [N, H]) of causal attention within documents.
Status AttentionForwardTc(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& cu_seqlens, double scale, Tensor* o, Tensor* lse,
                          cudaStream_t stream);

// PrefixCausalAttention's forward (kernels/attention.h): q [Nq, H, dqk], k [Nk, H, dqk], v
// [Nk, H, dv], queries and keys packed by cu_q and cu_k (i64 [docs + 1] each, on the device).
Status PrefixAttentionForwardTc(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_q, const Tensor& cu_k, double scale, Tensor* o,
                                Tensor* lse, cudaStream_t stream);

// dq, dk, dv given dsum = rowsum(dO * O) (f32 [N, H], the backward's preprocess) and the forward's
// lse; deterministic (each output element written once by one thread, no atomics).
Status AttentionBackwardTc(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                           const Tensor& dsum, const Tensor& d_o, const Tensor& cu_seqlens,
                           double scale, Tensor* dq, Tensor* dk, Tensor* dv, cudaStream_t stream);

}  // namespace orrery::kernels::cuda
