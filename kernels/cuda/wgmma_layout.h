// The index maps of the Hopper (sm_90a) tensor-core path as plain constexpr functions that host
// code can run too: where TMA puts a tile in shared memory, the wgmma shared-memory matrix
// descriptors that read it back, and which matrix element each register of a warpgroup holds.
// tests/unit/kernels/wgmma_layout_test.cc composes them with a host model of the PTX ISA's
// canonical layouts, so a wrong descriptor or fragment index fails without a GPU;
// tests/gpu/wgmma_probe_gpu_test.cc checks each layer on the GPU with known matrices.
//
// Tiles are bf16 and stored as column blocks of 64 (128 bytes): a [rows][cols] tile is cols / 64
// blocks of [rows][64], block b at b * rows * 128 bytes, each written by one TMA box with
// CU_TENSOR_MAP_SWIZZLE_128B to a 1024-byte aligned address. In a block the 16-byte chunk c of
// row r lies at chunk c ^ (r % 8) of the row (Sw128Offset): the hardware XORs address bits 4-6
// with bits 7-9, which is why the block must be 1024-byte aligned.
//
// wgmma reads its shared-memory operands through a 64-bit descriptor (PTX ISA, "Matrix Descriptor
// Format"): bits 0-13 the start address / 16, 16-29 the leading-dimension byte offset (LBO) / 16,
// 32-45 the stride-dimension byte offset (SBO) / 16, 49-51 the base offset (0: every swizzle atom
// 1024-byte aligned), 62-63 the swizzle mode (1 = 128-byte). With the 128-byte swizzle an atom is
// 8 rows of 128 bytes, and
//   K-major (rows = M or N, 16 k per instruction inside one 128-byte row): element (r, k) at
//     start + (r % 8) 128 + (r / 8) SBO + 2 k, SBO = 1024 (atoms of 8 rows follow each other),
//     LBO unused (16 by convention). A k step of 16 inside a 64-column block advances the start
//     by 32 bytes (KMajorDescriptor).
//   MN-major (the transposed B of a row-major [k][n] tile, wgmma's imm-trans-b = 1): element
//     (k, n) at start + 2 (n % 64) + (n / 64) LBO + (k % 8) 128 + (k / 8) SBO: LBO = the distance
//     between 64-column blocks (rows * 128 bytes), SBO = 1024 (8 k rows). A k step of 16 advances
//     the start by 16 rows, 2048 bytes (MnMajorDescriptor).
// and the swizzle is applied to the resulting address, as TMA applied it when writing.
//
// Register fragments (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts" of
// wgmma .m64nNk16): thread T = 32 w + l of the warpgroup (warp w, lane l, g = l / 4, t = l % 4)
//   f32 accumulator D [64][N], N / 2 registers: d[i] = D[16 w + g + 8 ((i / 2) % 2)][8 (i / 4) +
//     2 t + i % 2] (the m16n8 accumulator layout of mma.sync, one per 8 columns);
//   bf16 A [64][16] from registers, 4 registers of 2 values (low half first): a[j] holds
//     A[16 w + g + 8 (j % 2)][2 t + 8 (j / 2) + {0, 1}].
// So the A fragment of k step kk (columns 16 kk ..) of a matrix held as accumulators packs
// d[8 kk + 2 j] and d[8 kk + 2 j + 1] into a[j] (AccumulatorOfA): S's registers become P's
// operand without leaving the registers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ORRERY_WG_LAYOUT __host__ __device__ __forceinline__ constexpr
#else
#define ORRERY_WG_LAYOUT inline constexpr
#endif

namespace orrery::kernels::cuda::wgmma {

constexpr int kBlockCols = 64;         // bf16 columns of one 128-byte swizzled row
constexpr uint32_t kRowBytes = 128;    // one swizzled row
constexpr uint32_t kAtomBytes = 1024;  // 8 swizzled rows: the unit that must be aligned
constexpr uint64_t kSwizzle128B = 1;   // descriptor bits 62-63

// The byte offset of element (r, c), c < 64, in a [rows][64] bf16 block written by TMA with the
// 128-byte swizzle.
ORRERY_WG_LAYOUT uint32_t Sw128Offset(int r, int c) {
  return static_cast<uint32_t>(r) * kRowBytes + ((static_cast<uint32_t>((c >> 3) ^ (r & 7))) << 4) +
         static_cast<uint32_t>(c & 7) * 2;
}

// The byte offset of element (r, c) of a [rows][cols] tile stored as 64-column blocks.
ORRERY_WG_LAYOUT uint32_t TileOffset(int rows, int r, int c) {
  return static_cast<uint32_t>(c / kBlockCols) * static_cast<uint32_t>(rows) * kRowBytes +
         Sw128Offset(r, c % kBlockCols);
}

// A 128-byte-swizzle descriptor; addresses and offsets in bytes, multiples of 16 (the shared
// window is < 256 KB, so 18 address bits suffice).
ORRERY_WG_LAYOUT uint64_t SmemDescriptor(uint32_t start, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((start & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (kSwizzle128B << 62);
}

// The K-major operand of k step kk (k = 16 kk ..) of a tile whose 64-column blocks are
// `block_bytes` apart, its first operand row at `base` (a multiple of 1024 from the block start:
// whole atoms). An A operand of 64 rows or a B operand of N rows alike.
ORRERY_WG_LAYOUT uint64_t KMajorDescriptor(uint32_t base, uint32_t block_bytes, int kk) {
  return SmemDescriptor(
      base + static_cast<uint32_t>(kk / 4) * block_bytes + static_cast<uint32_t>(kk % 4) * 32, 16,
      kAtomBytes);
}

// The MN-major (transposed) B operand of k step kk (rows 16 kk .. of the [k][n] tile at `base`
// with `rows` rows, its n in 64-column blocks rows * 128 bytes apart).
ORRERY_WG_LAYOUT uint64_t MnMajorDescriptor(uint32_t base, int rows, int kk) {
  return SmemDescriptor(base + static_cast<uint32_t>(kk) * 16 * kRowBytes,
                        static_cast<uint32_t>(rows) * kRowBytes, kAtomBytes);
}

// The accumulator element register i of thread `lane` of warp `warp` (of the warpgroup) holds.
ORRERY_WG_LAYOUT int AccRow(int warp, int lane, int i) {
  return 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
}
ORRERY_WG_LAYOUT int AccCol(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

// The A-operand element half h of register j holds (rows as AccRow, columns of the k step).
ORRERY_WG_LAYOUT int FragARow(int warp, int lane, int j) {
  return 16 * warp + lane / 4 + 8 * (j % 2);
}
ORRERY_WG_LAYOUT int FragACol(int lane, int j, int h) { return 2 * (lane % 4) + 8 * (j / 2) + h; }

// The accumulator register that supplies half h of A register j at k step kk.
ORRERY_WG_LAYOUT int AccumulatorOfA(int kk, int j, int h) { return 8 * kk + 2 * j + h; }

}  // namespace orrery::kernels::cuda::wgmma

#undef ORRERY_WG_LAYOUT
