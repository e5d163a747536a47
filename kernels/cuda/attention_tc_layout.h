// The index arithmetic of the tensor-core attention kernels' shared-memory tiles and ldmatrix
// fragment loads (attention_tc_tiles.cuh), as plain constexpr functions that host code can run
// too: tests/unit/kernels/attention_tc_layout_test.cc checks them against the PTX definitions of
// ldmatrix and mma.m16n8k16 on a simulated warp, without a GPU.
//
// A tile holds rows of `cols` bf16 (cols a multiple of 64), no padding, 128-byte aligned; the
// 16-byte piece j of row r lies at piece j ^ (r % 8), so the 8 rows an ldmatrix phase reads at
// one column piece sit in 8 different bank groups.
//
// ldmatrix.x4 reads four 8x8 matrices; lane l gives the address of row l % 8 of matrix i = l / 8,
// which sits 8 sel_r(i) rows and sel_p(i) pieces past the fragment's corner (row0, col0), with
// row0 % 8 == 0 and col0 % 16 == 0. The byte offset of that piece,
//   R cols 2 + 16 ((col0 / 8 + sel_p) ^ (R % 8)),   R = row0 + l % 8 + 8 sel_r,
// splits into a per-lane part and per-fragment constants: R % 8 = l % 8 and col0 / 8 even give
//   (lane ^ 16 (col0 / 8 % 8)) + row0 cols 2 + 16 (col0 / 8 - col0 / 8 % 8),
//   lane = tile + (l % 8 + 8 sel_r) cols 2 + 16 (sel_p ^ l % 8)
// (the XOR touches address bits 4-6 only, which the added multiples of 128 leave alone). A
// fragment load then costs one XOR of a per-lane base and an immediate offset.
//
// Orders of the four matrices (g = lane / 4, t = lane % 4 for the registers received):
//   row order (sel_r = i % 2, sel_p = i / 2): (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15),
//     (8-15, 8-15). On a [m][k] tile: the A fragment a[0] = A[g][2t..], a[1] = A[g+8][2t..],
//     a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]. With .trans on a [k][n] tile: lane l gets
//     X[2t..][g] of each matrix, the B fragments b[0] = B[2t..][g], b[1] = B[2t+8..][g] of the
//     n-tile n0 (registers 0, 1) and of n0 + 8 (registers 2, 3).
//   column order (sel_r = i / 2, sel_p = i % 2): (0-7, 0-7), (0-7, 8-15), (8-15, 0-7),
//     (8-15, 8-15). On an [n][k] tile without .trans: lane l gets X[n = g][k = 2t..], the "col"
//     B fragments of B = X^T for n-tiles n0 (registers 0, 1) and n0 + 8 (registers 2, 3).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ORRERY_TC_LAYOUT __host__ __device__ __forceinline__ constexpr
#else
#define ORRERY_TC_LAYOUT inline constexpr
#endif

namespace orrery::kernels::cuda::attention_tc {

// The element offset of (r, c) in a swizzled tile of `cols` columns.
ORRERY_TC_LAYOUT int SwizzledElement(int r, int c, int cols) {
  return r * cols + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
}

// The per-lane byte offset from the tile's start (LaneBase in attention_tc_tiles.cuh adds the
// tile's shared address, which must be 128-byte aligned).
ORRERY_TC_LAYOUT uint32_t LaneByteOffset(int lane, int cols, bool row_order) {
  const int mat = lane >> 3, r = lane & 7;
  const int sel_r = row_order ? (mat & 1) : (mat >> 1);
  const int sel_p = row_order ? (mat >> 1) : (mat & 1);
  return static_cast<uint32_t>((r + 8 * sel_r) * cols * 2 + 16 * (sel_p ^ r));
}

// The address this lane gives ldmatrix for the fragment at (row0, col0), from its lane base.
ORRERY_TC_LAYOUT uint32_t FragmentAddress(uint32_t lane_base, int cols, int row0, int col0) {
  const int piece = col0 / 8;
  return (lane_base ^ static_cast<uint32_t>(16 * (piece & 7))) +
         static_cast<uint32_t>(row0 * cols * 2 + 16 * (piece & ~7));
}

// An m16n8 accumulator pair (lo: columns 16 kk .. + 7, hi: + 8 .. + 15) as the A fragment of
// k-step kk of the next product: register i of A packs elements 2 (i % 2), 2 (i % 2) + 1 of
// accumulator i / 2 (c[0..1] at row g, c[2..3] at row g + 8, columns 2t, 2t + 1 of each; the A
// layout above wants (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)).
ORRERY_TC_LAYOUT int AccumulatorOfA(int reg) { return reg / 2; }
ORRERY_TC_LAYOUT int AccumulatorElementOfA(int reg, int half) { return 2 * (reg % 2) + half; }

// Which (query, key) pairs a block computes. Query i of document [cu[d], cu[d+1]) sees keys
// cu[d] .. i. A block owns 64 rows (queries in the forward and the dq pass, keys in the dk/dv
// pass), 16 per warp, and streams tiles of the other side; it masks per element only the tiles
// where some pair is hidden, and a warp skips a tile where all its pairs are.

// The document of token i: the last d < entries - 1 with cu[d] <= i (cu: `entries` offsets).
ORRERY_TC_LAYOUT int64_t DocOf(const int64_t* cu, int64_t entries, int64_t i) {
  int64_t lo = 0, hi = entries - 1;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The first token of token i's document, or i + 1 for i >= n (a padding row that sees no key).
ORRERY_TC_LAYOUT int64_t DocStart(const int64_t* cu, int64_t entries, int64_t n, int64_t i) {
  return i < n ? cu[DocOf(cu, entries, i)] : i + 1;
}

// x clamped to [-1, hi]: a tile-relative bound for offsets 0 .. hi - 1, as a 32-bit int that
// compares with them exactly as x would.
ORRERY_TC_LAYOUT int ClampToTile(int64_t x, int hi) {
  return static_cast<int>(x < -1 ? -1 : (x > hi ? hi : x));
}

// The keys a query row sees in the forward, [First(i), Last(i)], both non-decreasing in i (the
// forward kernel's row maps; it takes one as a template argument).
//   CausalRows (CausalAttention): First = DocStart, Last = i.
//   PrefixRows (PrefixCausalAttention, kernels/attention.h): queries and keys packed with their
//   own offsets cu_q, cu_k (`entries` each). Query i of document d (cu_q[d] <= i < cu_q[d+1]) is
//   position L_d - n_d + (i - cu_q[d]) of its document's context of L_d keys (n_d its queries),
//   so it sees keys cu_k[d] .. i + cu_k[d+1] - cu_q[d+1]. Last rises by one within a document
//   and jumps by L_{d+1} - n_{d+1} + 1 >= 1 across a boundary (n <= L). A padding row (i >= nq)
//   sees none: First = kNoKey, Last = -1. With cu_q == cu_k it is CausalRows.
// With queries and keys packed alike the kernel's invariants hold for both: a block of rows q0 ..
// q_last streams keys First(q0) .. Last(q_last), a key tile is wholly visible when it lies in
// [First(q_last), Last(q0)], and a warp sees a tile that meets [First(its first row), Last(its
// last row)] (PrefixRows: keys of a document without queries between two with queries are
// streamed and masked, never computed).
inline constexpr int64_t kNoKey = int64_t{1} << 62;
struct CausalRows {
  const int64_t* cu;
  int64_t entries, n;
  ORRERY_TC_LAYOUT int64_t First(int64_t i) const { return DocStart(cu, entries, n, i); }
  ORRERY_TC_LAYOUT int64_t Last(int64_t i) const { return i; }
};
struct PrefixRows {
  const int64_t* cu_q;
  const int64_t* cu_k;
  int64_t entries, nq;
  ORRERY_TC_LAYOUT int64_t First(int64_t i) const {
    return i < nq ? cu_k[DocOf(cu_q, entries, i)] : kNoKey;
  }
  ORRERY_TC_LAYOUT int64_t Last(int64_t i) const {
    if (i >= nq) return -1;
    const int64_t d = DocOf(cu_q, entries, i);
    return i + cu_k[d + 1] - cu_q[d + 1];
  }
};

// Query-owning blocks (forward, dq): queries q0 .. q_last stream key tiles of `tile` keys from
// DocStart(q0) (every key from there to q_last is seen by some query of the block: by q0 or by
// itself) to q_last. The tile at kb is wholly visible when every key lies at or after the latest
// query document start (DocStart(q_last)) and at or before q0.
ORRERY_TC_LAYOUT int KeyTiles(int64_t kv_begin, int64_t q_last, int tile) {
  return static_cast<int>((q_last - kv_begin) / tile) + 1;
}
ORRERY_TC_LAYOUT bool KeyTileWhollyVisible(int64_t kb, int tile, int64_t q0, int64_t last_start) {
  return kb >= last_start && kb + tile - 1 <= q0;
}
// Whether a warp with rows from warp_first (document start warp_start, the warp's earliest) to
// warp_last sees some key of the tile at kb.
ORRERY_TC_LAYOUT bool WarpSeesKeyTile(int64_t kb, int tile, int64_t warp_start, int64_t warp_last) {
  return kb <= warp_last && kb + tile - 1 >= warp_start;
}

// Key-owning blocks (dk/dv): keys k0 .. k_last stream query tiles of `tile` queries from k0 (no
// earlier query sees a key >= k0) to q_stop, the end of k_last's document. Each streamed query
// carries its visible keys relative to k0, [q_lo, q_hi] = ClampToTile of DocStart(i) - k0 and
// i - k0 (for i >= n: DocStart = i + 1, none). The tile at qb is wholly visible to the block's
// `rows` keys when every query follows the last key and the last query's document (the latest
// start) starts at or before k0 (q_lo_last <= 0); a warp with keys k0 + key_first ..
// k0 + key_first + 15 sees some query when the tile reaches its first key and the first query's
// document (the earliest start, q_lo_first) starts at or before its last key.
ORRERY_TC_LAYOUT int QueryTiles(int64_t k0, int64_t q_stop, int tile) {
  return static_cast<int>((q_stop - k0 + tile - 1) / tile);
}
ORRERY_TC_LAYOUT bool QueryTileWhollyVisible(int64_t qb, int64_t k0, int rows, int q_lo_last) {
  return qb >= k0 + rows - 1 && q_lo_last <= 0;
}
ORRERY_TC_LAYOUT bool WarpSeesQueryTile(int64_t qb, int tile, int64_t k0, int key_first,
                                        int q_lo_first) {
  return qb + tile - 1 >= k0 + key_first && q_lo_first <= key_first + 15;
}

}  // namespace orrery::kernels::cuda::attention_tc

#undef ORRERY_TC_LAYOUT
