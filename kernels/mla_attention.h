// Causal softmax attention per document, the core of gated MLA's training form (spec §3.1-3.2).
//
// Layouts (N packed tokens, H heads): q, k [N, H, dqk]; v, o [N, H, dv]; lse [N, H].
// `cu_seqlens` (n_docs + 1 offsets into N) delimits documents: a token attends to the tokens of
// its own document up to itself. The forward saves the log-sum-exp of each row; the backward
// recomputes the probabilities from it (FlashAttention style). Generic over float and double;
// work is split over (document, head) pairs on the default thread pool, products go through
// kernels/gemm.h.
#pragma once

#include <cstdint>
#include <vector>

namespace orrery::kernels {

struct AttentionShape {
  int64_t tokens = 0;  // N
  int64_t heads = 0;   // H
  int64_t qk_dim = 0;  // dqk
  int64_t v_dim = 0;   // dv
};

template <typename T>
void CausalAttentionForward(const AttentionShape& s, const std::vector<int64_t>& cu_seqlens,
                            double scale, const T* q, const T* k, const T* v, T* o, T* lse);

// dq, dk, dv are overwritten.
template <typename T>
void CausalAttentionBackward(const AttentionShape& s, const std::vector<int64_t>& cu_seqlens,
                             double scale, const T* q, const T* k, const T* v, const T* o,
                             const T* lse, const T* d_o, T* dq, T* dk, T* dv);

// Prefix-causal attention (kernels/attention.h PrefixCausalAttention): document d's
// n_d = cu_q[d+1] - cu_q[d] queries are the last positions of its L_d = cu_k[d+1] - cu_k[d] keys
// (n_d <= L_d); its query i attends to keys 0 .. L_d - n_d + i. q, o [q_tokens, H, ...]; k, v
// [k_tokens, H, ...]; lse [q_tokens, H]. Work is split over (document, head, block of 64 queries)
// so that the scores of a task are at most 64 x L_d.
struct PrefixAttentionShape {
  int64_t q_tokens = 0;  // Nq
  int64_t k_tokens = 0;  // Nk
  int64_t heads = 0;     // H
  int64_t qk_dim = 0;    // dqk
  int64_t v_dim = 0;     // dv
};

template <typename T>
void PrefixCausalAttentionForward(const PrefixAttentionShape& s, const std::vector<int64_t>& cu_q,
                                  const std::vector<int64_t>& cu_k, double scale, const T* q,
                                  const T* k, const T* v, T* o, T* lse);

}  // namespace orrery::kernels
