// The tiling shared by the tensor-core KDA forward and backward (kda_forward_tc.cu,
// kda_backward_tc.cu): 64-token chunks in 16x16 bf16 tiles, 64-wide V slices in the state
// passes, and the chunk and segment tables the host side uploads for them.
#pragma once

#include <cstdint>

namespace orrery::kernels::cuda {

constexpr int kTcChunk = 64;   // tokens per chunk (four 16-row tiles)
constexpr int kTcSliceV = 64;  // V columns per state-pass block
constexpr float kLog2e = 1.4426950408889634f;
// Largest log2 decay across one diagonal 16-token tile for which its products run on tensor
// cores with a reference row at the tile's edge (bounded gate: <= 15 * 5 / ln 2 = 108.2). The
// factors 2^span <= 2^112 fit bf16, and the masked products, <= K * 2^112 = 2^119 for K = 128,
// stay finite in fp32. Tiles past it (the original gate with strong decays) are summed pairwise
// in fp32 with exponents <= 0.
constexpr float kMaxTileSpan = 112.0f;
constexpr int kTileStrideA = 72;  // bf16 row stride of 64-wide tiles (+8 against bank conflicts)

// One chunk of one sequence: flattened token rows [row_start, row_start + len).
struct ChunkDesc {
  int64_t row_start;  // first flattened token row
  int64_t len;        // valid rows, 1..64
};

// The chunks one state-pass block walks (the forward from chunk_begin up, the backward from
// chunk_end - 1 down), the state it starts from and where the state it ends with goes (the
// backward's "state" is dS: state_in at the segment end, state_out at its start).
struct SegmentDesc {
  int64_t chunk_begin, chunk_end;  // global chunk indices
  const float* state_in;           // [H, K, in_ld] or null (zeros; identity in transition slices)
  float* state_out;                // [H, K, out_ld] or null
  // The blocks of V slices below this return at once: a segment of which only the transition
  // is wanted (the forward's last segment, whose transition only the backward reads).
  int64_t slice_begin;
};
static_assert(sizeof(SegmentDesc) == 5 * sizeof(int64_t), "the host tables' layout");

}  // namespace orrery::kernels::cuda
