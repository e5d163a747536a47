// Absorbed-latent MLA decode over a paged latent cache (spec §3.3): the rollout engine's attention
// step for gated MLA, dispatched by device. The CPU path is plain loops accumulating in f64 (the
// oracle of the CUDA kernels); the CUDA path (kernels/cuda/mla_decode.cu) reads each latent row
// once for all heads and queries of a sequence and splits long contexts over thread blocks.
//
// The cache row of a token is [c-hat | k^R]: c-hat = RMSNorm(c_kv) (kv_lora_rank wide, the
// normalised latent, already multiplied by the kv_a_norm weight) followed by the unrotated shared
// rope key k^R (qk_rope_head_dim wide). This is the host model's row order (model/layers/mla.cc,
// MlaLayer::Infer). The caller absorbs the weights: q_h = [W_UK,h^T q^N_h | q^R_h] (D wide) in, and
// the output is the latent o_h = sum_j p_hj c-hat_j (dv = kv_lora_rank wide), which the caller
// multiplies by W_UV,h. The scale is the MHA form's, (qk_nope_head_dim + qk_rope_head_dim)^-1/2
// (192^-1/2 in K3), passed in: absorption does not change the scores.
//
// Pages: a page holds page_size consecutive positions of one sequence; sequence n's position p
// lives in page block_table[n][p / page_size] at offset p % page_size. Pages may be shared by
// sequences (a common prefix) and appear in any order in the pool.
//
// Dtypes: cpu f32 or f64, cuda bf16 or f32; pages, latents and q of one dtype on one device,
// block_table, context_lens and slot_mapping i32 on that device. On cpu the index values are
// checked (one InvalidArgument line); on cuda they are trusted (reading them back would
// synchronise the stream), and the kernels only guard their own memory: a context length is
// clamped to [0, max_pages_per_seq * page_size] and a write to a slot outside the pool is
// skipped; a page id outside the pool is the caller's bug.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

struct PagedLatentCache {
  Tensor pages;        // [num_pages, page_size, D] bf16 or f32; D = kv_lora_rank + qk_rope_head_dim
                       // (K3: 512 + 64 = 576). Row = [c-hat (normalised latent, Dv wide) | k^R].
  Tensor block_table;  // [N, max_pages_per_seq] i32: page ids of sequence n, in order
  Tensor context_lens;  // [N] i32: tokens of sequence n in the cache, including the new ones
};

// Writes latents [T, D] into pages at slot_mapping[t] = page_id * page_size + offset (i32 [T]).
// A negative slot skips its row (padding tokens of a batch). Two rows to one slot: one of them
// wins (the later on cpu, either on cuda).
Status PagedLatentWrite(const Tensor& latents, const Tensor& slot_mapping, Tensor* pages);

// Absorbed MLA attention (spec §3.3) for N sequences with Q new query tokens each (Q >= 1; their
// latents already written at positions context_lens[n]-Q .. context_lens[n]-1). Query j of
// sequence n attends causally to cache positions [0, context_lens[n] - Q + j].
// q [N, Q, H, D] (the absorbed query: q_nope·W_UK per head ‖ q_rope), dtype of pages; scores =
// scale · q·row over all D; o [N, Q, H, dv] = softmax-weighted sum of the rows' first dv columns
// (the latent), dtype of q; lse [N, Q, H] f32 (natural log). Allocates o and lse (when undefined;
// defined ones are checked and overwritten). 1 <= dv <= D; on cpu context_lens[n] must be in [Q,
// max_pages_per_seq * page_size]. On cuda a query with no visible position (context_lens[n] - Q + j
// < 0) gets o = 0 and lse = -inf.
Status MlaDecodePaged(const Tensor& q, const PagedLatentCache& cache, int64_t dv, float scale,
                      Tensor* o, Tensor* lse);

// The index values of a cache whose block_table and context_lens are on the cpu (pages on any
// device; only their shape is read), for `queries` new tokens per sequence: block_table
// i32 [N, max_pages_per_seq], context_lens i32 [N], context_lens[n] in [queries,
// max_pages_per_seq * page_size], and the page ids sequence n uses (its first
// ceil(context_lens[n] / page_size) entries) in [0, num_pages). One InvalidArgument line for the
// first bad value. MlaDecodePaged runs it on cpu; a caller whose tables live on the GPU checks
// its host copies with it before uploading them.
Status CheckPagedLatentIndices(const PagedLatentCache& cache, int64_t queries);

// The widest cache row (D) the CUDA path takes (K3's is 576).
inline constexpr int64_t kMaxMlaDecodeWidthCuda = 1024;

// The most splits of one context the CUDA path uses (its merge pass reads all of them per row).
inline constexpr int kMaxMlaDecodeSplits = 256;

// How the CUDA path splits each sequence's context over thread blocks.
struct MlaDecodeOptions {
  // 0 (the default): chosen from the batch, the cache's capacity per sequence and the SM count so
  // that the grid fills the device. k >= 1: k splits of every context (at most
  // kMaxMlaDecodeSplits; a split past a context's end contributes nothing): 1 turns splitting
  // off, more force it (tests, benchmarks).
  int max_splits = 0;
};

// MlaDecodePaged with options (the split choice is the CUDA path's; the CPU twin ignores it).
Status MlaDecodePaged(const Tensor& q, const PagedLatentCache& cache, int64_t dv, float scale,
                      const MlaDecodeOptions& options, Tensor* o, Tensor* lse);

}  // namespace orrery::kernels
