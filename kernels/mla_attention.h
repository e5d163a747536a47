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

}  // namespace orrery::kernels
