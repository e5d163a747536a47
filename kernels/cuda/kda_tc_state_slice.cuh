// The K x 64 slice of the state S (forward) or of its gradient dS (backward) that a group of 4
// warps of a state-pass block holds in fp32 MMA accumulators (kda_forward_tc.cu,
// kda_backward_tc.cu): the group's warp w owns rows d = w K / 4 + 16 mi + {g8, g8 + 8} and
// columns 8 nt + 2 t4 + {0, 1} (g8 = lane / 4, t4 = lane % 4; the m16n8 accumulator layout of
// kda_mma.cuh).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/kda_tc_layout.cuh"

namespace orrery::kernels::cuda {

// Shared memory of a state-pass block of kGroups groups of 4 warps, each group carrying one
// 64-column slice (both directions). Per chunk, shared by the groups (copied once for both):
// W and s Q e^G [64][K + 8], Kbar^T [K][72], A_qk [64][72], gamma [K] f32. Per group, at
// kGroup + g kGroupBytes: its slice of U (forward) or dO (backward) [64][72], the slice
// transposed in bf16 [64][K + 8], Vnew^T or -dVnew^T [64][72], and the forward's output tile
// [64][72] (each warp's 16 rows staged for whole-row stores; the backward's second dO buffer).
template <int KD, int kGroups>
struct StatePassSmem {
  static constexpr int kSK = KD + 8;
  static constexpr int kSU = kTcSliceV + 8;
  static constexpr size_t kW = 0;
  static constexpr size_t kQ = kW + sizeof(__nv_bfloat16) * kTcChunk * kSK;
  static constexpr size_t kKb = kQ + sizeof(__nv_bfloat16) * kTcChunk * kSK;
  static constexpr size_t kA = kKb + sizeof(__nv_bfloat16) * KD * kTileStrideA;
  static constexpr size_t kGam = kA + sizeof(__nv_bfloat16) * kTcChunk * kTileStrideA;
  static constexpr size_t kGroup = kGam + sizeof(float) * KD;
  static constexpr size_t kSlice = 0;  // offsets within a group's region
  static constexpr size_t kS = kSlice + sizeof(__nv_bfloat16) * kTcChunk * kSU;
  static constexpr size_t kVt = kS + sizeof(__nv_bfloat16) * kTcSliceV * kSK;
  static constexpr size_t kO = kVt + sizeof(__nv_bfloat16) * kTcSliceV * kTileStrideA;
  static constexpr size_t kGroupBytes = kO + sizeof(__nv_bfloat16) * kTcChunk * kTileStrideA;
  static constexpr size_t kBytes = kGroup + kGroups * kGroupBytes;
  static_assert(kQ % 16 == 0 && kKb % 16 == 0 && kA % 16 == 0 && kGam % 16 == 0 &&
                    kGroup % 16 == 0 && kS % 16 == 0 && kVt % 16 == 0 && kO % 16 == 0 &&
                    kGroupBytes % 16 == 0,
                "16-byte aligned regions");
  static_assert(kBytes <= (kGroups == 1 ? 113 : 227) * 1024, "blocks per multiprocessor");
};

template <int KD>
struct StateSlice {
  static constexpr int kMT = KD / 64;        // 16-row tiles per warp
  static constexpr int kNT = kTcSliceV / 8;  // 8-column tiles of the slice
  float x[kMT][kNT][4];

  __device__ static int Row(int mi, int e) {
    const int lane = threadIdx.x & 31;
    return ((threadIdx.x >> 5) & 3) * (KD / 4) + 16 * mi + (lane >> 2) + (e >> 1) * 8;
  }
  __device__ static int Col(int nt, int e) {
    return 8 * nt + 2 * ((threadIdx.x & 31) & 3) + (e & 1);
  }

  // Transition slices (the K x K transition's columns identity_col0 .. + 63) start as the
  // identity's columns; others as in[d * ld + c] (fp32), or zeros when `in` is null.
  __device__ void Init(bool transition, int identity_col0, const float* in, int64_t ld) {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = Row(mi, e), c = Col(nt, e);
          float v = 0.0f;
          if (transition) {
            v = d == identity_col0 + c ? 1.0f : 0.0f;
          } else if (in != nullptr) {
            v = in[d * ld + c];
          }
          x[mi][nt][e] = v;
        }
      }
    }
  }

  // The slice transposed and rounded to bf16 in shared memory: st[c * stride + d] (the MMAs' B
  // operand), one 16x16 tile per `stmatrix` (stride a multiple of 8, st 16-byte aligned).
  __device__ void StoreTransposedBf16(__nv_bfloat16* st, int stride) const {
    const int d0 = ((threadIdx.x >> 5) & 3) * (KD / 4);
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        StoreTileTransposedBf16(x[mi][nt], x[mi][nt + 1], st + 8 * nt * stride + d0 + 16 * mi,
                                stride);
      }
    }
  }

  // fp32 to out[d * ld + c].
  __device__ void StoreF32(float* out, int64_t ld) const {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) out[Row(mi, e) * ld + Col(nt, e)] = x[mi][nt][e];
      }
    }
  }

  // Row d scaled by gamma[d] (the chunk's decay, Diag(gamma) S).
  __device__ void ScaleRows(const float* gamma) {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[mi][nt][e] *= gamma[Row(mi, e)];
      }
    }
  }
};

}  // namespace orrery::kernels::cuda
