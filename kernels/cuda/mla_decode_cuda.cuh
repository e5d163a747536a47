// The pieces the absorbed MLA decode kernels share (kernels/mla_decode.h): the problem as the
// kernels see it, the split of a context over blocks and the causal limit of a query row, and
// the launches of the three kernels (the tensor-core split kernel in mla_decode.cu, the SIMT split
// kernel in mla_decode_simt.cu, the log-sum-exp merge in mla_decode_merge.cu).
//
// A block owns (sequence n, split s, row group g): rows are the sequence's Q * H query rows
// r = j * H + h (q and o rows n * R + r, R = Q * H), kMlaRows of them per group, and the split is a
// range of kMlaTile-position tiles of the context. With one split a block writes o and lse
// itself; with more it writes its normalised partial output and log-sum-exp (f32) and the merge
// combines the splits of each row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace orrery::kernels::cuda {

inline constexpr int kMlaRows = 16;      // query rows per block (one m16 tile of the mma)
inline constexpr int kMlaTile = 32;      // context positions per shared-memory tile
inline constexpr int kMlaThreads = 256;  // 8 warps

struct MlaDecodeProblem {
  const void* q = nullptr;                // [N, Q, H, D], the pages' dtype
  const void* pages = nullptr;            // [num_pages, page_size, D]
  const int32_t* block_table = nullptr;   // [N, max_pages]
  const int32_t* context_lens = nullptr;  // [N]
  int n = 0, nq = 0, heads = 0, d = 0, dv = 0;
  int page_size = 0, max_pages = 0;
  int rows = 0;    // R = Q * H
  int groups = 0;  // ceil(R / kMlaRows)
  int splits = 1;
  float scale = 1.0f;
  void* o = nullptr;          // [N, Q, H, dv], the pages' dtype (splits == 1)
  float* lse = nullptr;       // [N, Q, H] (splits == 1)
  float* part_o = nullptr;    // [N, splits, R, dv] (splits > 1)
  float* part_lse = nullptr;  // [N, splits, R] (splits > 1)
};

// The block's (n, s, g) from its flat index (g fastest, so that the groups of one split, which read
// the same latents, run side by side and share them through L2).
struct MlaBlock {
  int n, s, g;
};
__device__ __forceinline__ MlaBlock MlaBlockOf(const MlaDecodeProblem& p) {
  const int b = static_cast<int>(blockIdx.x);
  return {b / (p.groups * p.splits), (b / p.groups) % p.splits, b % p.groups};
}

// Sequence n's context length, clamped to what its block table can address.
__device__ __forceinline__ int MlaContextLength(const MlaDecodeProblem& p, int n) {
  const int len = p.context_lens[n];
  return min(max(len, 0), p.max_pages * p.page_size);
}

// Split s of a context of len positions: whole tiles, as even as the tiles allow; begin >= end
// when the split has nothing (more splits than tiles).
__device__ __forceinline__ void MlaSplitRange(int len, int splits, int s, int* begin, int* end) {
  const int64_t tiles = (len + kMlaTile - 1) / kMlaTile;
  const int64_t per = (tiles + splits - 1) / splits;
  const int64_t b = s * per * kMlaTile, e = (s + 1) * per * kMlaTile;
  *begin = static_cast<int>(b < len ? b : len);
  *end = static_cast<int>(e < len ? e : len);
}

// The end (exclusive) of the positions row r of a sequence of len positions sees within the split
// [.., end): query j = r / H sees positions <= len - Q + j. -1 for the group's padding rows.
__device__ __forceinline__ int MlaRowLimit(const MlaDecodeProblem& p, int r, int len, int end) {
  if (r >= p.rows) return -1;
  return min(len - p.nq + r / p.heads + 1, end);
}

// The address of position pos of sequence n (an element offset into pages).
__device__ __forceinline__ int64_t MlaRowOffset(const MlaDecodeProblem& p, int n, int pos) {
  const int page = __ldg(p.block_table + static_cast<int64_t>(n) * p.max_pages + pos / p.page_size);
  return (static_cast<int64_t>(page) * p.page_size + pos % p.page_size) * p.d;
}

// Whether the tensor-core kernel takes the problem: bf16, D a multiple of 16 up to
// kMlaTcMaxWidth, dv a multiple of 64 up to 512, 16-byte aligned q and pages, 4-byte aligned o.
inline constexpr int kMlaTcMaxWidth = 640;
bool MlaDecodeTcSupports(const MlaDecodeProblem& p, bool bf16);

// The split kernels' launches (blocks = N * splits * groups), their blocks per SM (for the split
// choice), and the merge (splits > 1). `bf16` picks the element type of q, pages and o.
Status LaunchMlaDecodeTc(const MlaDecodeProblem& p, cudaStream_t stream);
StatusOr<int> MlaDecodeTcBlocksPerSm(const MlaDecodeProblem& p);
Status LaunchMlaDecodeSimt(const MlaDecodeProblem& p, bool bf16, cudaStream_t stream);
StatusOr<int> MlaDecodeSimtBlocksPerSm(const MlaDecodeProblem& p, bool bf16);
Status LaunchMlaDecodeMerge(const MlaDecodeProblem& p, bool bf16, cudaStream_t stream);

}  // namespace orrery::kernels::cuda
