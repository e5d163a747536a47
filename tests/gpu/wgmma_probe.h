// Single-CTA probes of the Hopper primitives the wgmma attention forward is built from
// (kernels/cuda/hopper.cuh, wgmma_layout.h, tensor_map.h), one layer each, so that a wrong layout
// fails with the layer's name (tests/gpu/wgmma_probe_gpu_test.cc):
//   TmaBox: a TMA box as it lands in shared memory (tensor map, 128-byte swizzle, mbarrier
//     transaction count, zero fill past the matrix);
//   ProductSS: D = A B^T by wgmma.m64n{64,128}k16 with both operands K-major in shared memory
//     (the descriptors of S = Q K^T and dP = dO V^T, the accumulator map);
//   ProductRS: D = A B by wgmma.m64n{128,192}k16 with A from registers (the A-fragment map) and
//     B a row-major [k][n] tile read transposed (the MN-major descriptor of O += P V and of
//     dQ += dS K);
//   Chain: O = bf16(Q K^T) V, S's accumulators repacked as P's A fragments (AccumulatorOfA), the
//     forward's two products in its own order.
// Matrices are row-major float vectors holding bf16-exact values; results come back as floats.
#pragma once

#include <vector>

#include "core/status.h"

namespace orrery::kernels::wgmma_probe {

// The [rows][cols] matrix x, box [128][64] at column x0, row y0: the 128 x 64 values of shared
// memory in address order (element e at byte 2 e of the box).
Status TmaBox(const std::vector<float>& x, int rows, int cols, int x0, int y0,
              std::vector<float>* smem);

// d [64][b_rows] = A[64 half .. 64 half + 63][:] B^T for a [128][k] and b [b_rows][k], k 128 or
// 192, b_rows 64 or 128.
Status ProductSS(const std::vector<float>& a, const std::vector<float>& b, int k, int b_rows,
                 int half, std::vector<float>* d);

// d [64][n] = a [64][k] b [k][n], k 64 or 128, n 128 or 192.
Status ProductRS(const std::vector<float>& a, const std::vector<float>& b, int k, int n,
                 std::vector<float>* d);

// s [64][128] = Q[64 half ..][:] K^T and o [64][128] = bf16(s) V for q, k [128][dqk], v
// [128][128], dqk 128 or 192.
Status Chain(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
             int dqk, int half, std::vector<float>* s, std::vector<float>* o);

}  // namespace orrery::kernels::wgmma_probe
