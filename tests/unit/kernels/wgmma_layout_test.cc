// The Hopper attention forward's index maps (kernels/cuda/wgmma_layout.h) against a host model of
// the hardware, without a GPU:
//   TMA's 128-byte swizzle, modelled as the address-bit rule of CUDA's tensor-map documentation
//     (16-byte chunk bits 4-6 XOR row bits 7-9 of the shared address);
//   wgmma's shared-memory operands, modelled from the PTX ISA's canonical layouts (the element
//     address of a K-major or MN-major 128-byte-swizzled operand from the descriptor's start, LBO
//     and SBO fields, then the same swizzle);
//   the register fragments of wgmma.m64nNk16 (accumulators, A from registers).
// The forward's two products are then formed through the descriptors and fragment maps the kernel
// uses (attention_forward_wgmma.cu: the 128-row Q tile, a 128-key K tile, V read transposed, S's
// accumulators repacked as P) on tiles at the kernel's shared-memory offsets, and compared with the
// plain matrix products; and the kernel's tile ranges and masks are checked to compute every
// visible (query, key) pair exactly once and no hidden one.
#include "kernels/cuda/wgmma_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "kernels/cuda/attention_tc_layout.h"

namespace orrery::kernels::cuda::wgmma {
namespace {

// The swizzle of a shared address (both TMA's writes and wgmma's reads apply it).
uint32_t Swizzle(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

struct Descriptor {
  uint32_t start, lbo, sbo, base_offset, mode;
};
Descriptor Decode(uint64_t d) {
  return {static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4, static_cast<uint32_t>((d >> 49) & 7),
          static_cast<uint32_t>(d >> 62)};
}

// The shared address wgmma reads for element (r, k) (r < M or N, k < 16) of a K-major operand
// (canonical ((8, m), (8, 2)) : ((128 B, SBO), (2 B, 16 B))) and for element (k, n) of an MN-major
// one (((64, n), (8, k)) : ((2 B, LBO), (128 B, SBO))), both with the 128-byte swizzle.
uint32_t KMajorAddress(uint64_t desc, int r, int k) {
  const Descriptor d = Decode(desc);
  EXPECT_EQ(d.mode, 1u) << "not the 128-byte swizzle";
  EXPECT_EQ(d.base_offset, 0u);
  return Swizzle(d.start + static_cast<uint32_t>(r % 8) * 128 +
                 static_cast<uint32_t>(r / 8) * d.sbo + static_cast<uint32_t>(k) * 2);
}
uint32_t MnMajorAddress(uint64_t desc, int k, int n) {
  const Descriptor d = Decode(desc);
  EXPECT_EQ(d.mode, 1u) << "not the 128-byte swizzle";
  EXPECT_EQ(d.base_offset, 0u);
  return Swizzle(d.start + static_cast<uint32_t>(n % 64) * 2 +
                 static_cast<uint32_t>(n / 64) * d.lbo + static_cast<uint32_t>(k % 8) * 128 +
                 static_cast<uint32_t>(k / 8) * d.sbo);
}

TEST(WgmmaLayout, Sw128OffsetIsTheAddressSwizzle) {
  // A box written at a 1024-aligned address: Sw128Offset is the swizzle of the linear offset.
  for (const uint32_t base : {0u, 1024u, 7u * 1024}) {
    for (int r = 0; r < 128; ++r) {
      for (int c = 0; c < 64; ++c) {
        ASSERT_EQ(base + Sw128Offset(r, c), Swizzle(base + static_cast<uint32_t>(r * 128 + 2 * c)))
            << "row " << r << " column " << c;
      }
    }
  }
  // ... a permutation of the block's 16-byte chunks.
  std::vector<int> seen(128 * 8, 0);
  for (int r = 0; r < 128; ++r) {
    for (int c = 0; c < 64; c += 8) ++seen[Sw128Offset(r, c) / 16];
  }
  for (int i = 0; i < 128 * 8; ++i) EXPECT_EQ(seen[i], 1) << "chunk " << i;
}

TEST(WgmmaLayout, DescriptorFields) {
  const uint64_t d = SmemDescriptor(0x2F400, 16 * 1024, 1024);
  const Descriptor f = Decode(d);
  EXPECT_EQ(f.start, 0x2F400u);
  EXPECT_EQ(f.lbo, 16u * 1024);
  EXPECT_EQ(f.sbo, 1024u);
  EXPECT_EQ(f.base_offset, 0u);
  EXPECT_EQ(f.mode, 1u);
  EXPECT_EQ((d >> 14) & 3, 0u);  // reserved bits stay clear
  EXPECT_EQ((d >> 30) & 3, 0u);
  EXPECT_EQ((d >> 46) & 7, 0u);
  EXPECT_EQ((d >> 52) & 0x3FF, 0u);
}

// Every accumulator element of m64n128 is held by exactly one (thread, register), and the A
// fragment map covers [64][16] once.
TEST(WgmmaLayout, FragmentsArePermutations) {
  std::vector<int> acc(64 * 128, 0), a(64 * 16, 0);
  for (int w = 0; w < 4; ++w) {
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < 64; ++i) ++acc[AccRow(w, l, i) * 128 + AccCol(l, i)];
      for (int j = 0; j < 4; ++j) {
        for (int h = 0; h < 2; ++h) ++a[FragARow(w, l, j) * 16 + FragACol(l, j, h)];
      }
    }
  }
  for (int e : acc) ASSERT_EQ(e, 1);
  for (int e : a) ASSERT_EQ(e, 1);
}

// A host shared memory of bf16 values (small integers: exact sums in double).
struct Smem {
  std::vector<double> mem = std::vector<double>(232448 / 2, 0.0);
  double& At(uint32_t addr) {
    EXPECT_EQ(addr % 2, 0u);
    return mem.at(addr / 2);
  }
  // The [rows][cols] tile x as TMA writes it at `base` (64-column boxes, TileOffset).
  void Store(uint32_t base, int rows, int cols, const std::vector<double>& x) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) At(base + TileOffset(rows, r, c)) = x[r * cols + c];
    }
  }
};

std::vector<double> Random(int count, PhiloxGenerator& rng) {
  std::vector<double> x(count);
  for (double& v : x) v = static_cast<double>(static_cast<int>(rng.UniformInt(9)) - 4);
  return x;
}

// The forward's products for one consumer warpgroup through the kernel's descriptors: Q [128][dqk]
// at 0, the K tile [128][dqk] and the V tile [128][128] of stage 1 at the kernel's offsets.
void CheckForwardProducts(int dqk) {
  SCOPED_TRACE("dqk " + std::to_string(dqk));
  constexpr int kM = 128, kN = 128, kDv = 128;
  PhiloxGenerator rng(static_cast<uint64_t>(dqk), 0);
  const std::vector<double> q = Random(kM * dqk, rng), k = Random(kN * dqk, rng),
                            v = Random(kN * kDv, rng);
  const uint32_t q_base = 0, q_bytes = kM * dqk * 2, k_bytes = kN * dqk * 2;
  const uint32_t k_tile = q_bytes + k_bytes;                     // stage 1 of the K ring
  const uint32_t v_tile = q_bytes + 2 * k_bytes + kN * kDv * 2;  // stage 1 of the V ring
  ASSERT_EQ(k_tile % 1024, 0u);
  ASSERT_EQ(v_tile % 1024, 0u);
  Smem smem;
  smem.Store(q_base, kM, dqk, q);
  smem.Store(k_tile, kN, dqk, k);
  smem.Store(v_tile, kN, kDv, v);

  for (int consumer = 0; consumer < 2; ++consumer) {
    const uint32_t q_rows = q_base + static_cast<uint32_t>(consumer) * 64 * kRowBytes;
    // S = Q K^T over dqk / 16 k steps (IssueQK).
    std::vector<double> s(64 * kN, 0.0);
    for (int kk = 0; kk < dqk / 16; ++kk) {
      const uint64_t a = KMajorDescriptor(q_rows, kM * kRowBytes, kk);
      const uint64_t b = KMajorDescriptor(k_tile, kN * kRowBytes, kk);
      for (int m = 0; m < 64; ++m) {
        for (int n = 0; n < kN; ++n) {
          for (int kx = 0; kx < 16; ++kx) {
            s[m * kN + n] += smem.At(KMajorAddress(a, m, kx)) * smem.At(KMajorAddress(b, n, kx));
          }
        }
      }
    }
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < kN; ++n) {
        double want = 0.0;
        for (int c = 0; c < dqk; ++c) want += q[(64 * consumer + m) * dqk + c] * k[n * dqk + c];
        ASSERT_EQ(s[m * kN + n], want)
            << "S consumer " << consumer << " (" << m << ", " << n << ")";
      }
    }
    // S's accumulators per thread, repacked as P's A fragments (PackP), then O = P V through the
    // MN-major descriptor of V (IssuePV).
    std::vector<double> o(64 * kDv, 0.0);
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint64_t b = MnMajorDescriptor(v_tile, kN, kk);
      std::vector<double> a(64 * 16, -1e9);  // the A operand the registers carry
      for (int w = 0; w < 4; ++w) {
        for (int l = 0; l < 32; ++l) {
          for (int j = 0; j < 4; ++j) {
            for (int h = 0; h < 2; ++h) {
              const int i = AccumulatorOfA(kk, j, h);
              a[FragARow(w, l, j) * 16 + FragACol(l, j, h)] =
                  s[AccRow(w, l, i) * kN + AccCol(l, i)];
            }
          }
        }
      }
      for (int m = 0; m < 64; ++m) {
        for (int kx = 0; kx < 16; ++kx) {
          ASSERT_EQ(a[m * 16 + kx], s[m * kN + 16 * kk + kx]) << "P fragment k step " << kk;
        }
        for (int n = 0; n < kDv; ++n) {
          for (int kx = 0; kx < 16; ++kx) {
            o[m * kDv + n] += a[m * 16 + kx] * smem.At(MnMajorAddress(b, kx, n));
          }
        }
      }
    }
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < kDv; ++n) {
        double want = 0.0;
        for (int c = 0; c < kN; ++c) want += s[m * kN + c] * v[c * kDv + n];
        ASSERT_EQ(o[m * kDv + n], want)
            << "O consumer " << consumer << " (" << m << ", " << n << ")";
      }
    }
  }
}

TEST(WgmmaLayout, ForwardProductsThroughTheDescriptors) {
  CheckForwardProducts(192);
  CheckForwardProducts(128);
}

// The dq pass's products (attention_backward_dq_wgmma.cu) through its descriptors: S = Q K^T and
// dP = dO V^T with 64-key tiles (N = 64), and dQ = dS K with dS repacked from the accumulators and
// the K tile [64][dqk] read transposed (N = dqk).
void CheckDqProducts(int dqk) {
  SCOPED_TRACE("dq pass, dqk " + std::to_string(dqk));
  constexpr int kM = 128, kN = 64, kDv = 128;
  PhiloxGenerator rng(static_cast<uint64_t>(dqk) + 7, 0);
  const std::vector<double> q = Random(kM * dqk, rng), d_o = Random(kM * kDv, rng),
                            k = Random(kN * dqk, rng), v = Random(kN * kDv, rng);
  const uint32_t q_base = 0, do_base = kM * dqk * 2;
  const uint32_t k_tile = do_base + kM * kDv * 2 + kN * dqk * 2;  // stage 1 of the K ring
  const uint32_t v_tile = k_tile + 2 * kN * dqk * 2;              // a V stage after the ring
  ASSERT_EQ(k_tile % 1024, 0u);
  ASSERT_EQ(v_tile % 1024, 0u);
  Smem smem;
  smem.Store(q_base, kM, dqk, q);
  smem.Store(do_base, kM, kDv, d_o);
  smem.Store(k_tile, kN, dqk, k);
  smem.Store(v_tile, kN, kDv, v);
  for (int consumer = 0; consumer < 2; ++consumer) {
    const uint32_t rows = static_cast<uint32_t>(consumer) * 64 * kRowBytes;
    // S and dP (IssueSdP): A from the 128-row tiles, B from the 64-row tiles.
    std::vector<double> s(64 * kN, 0.0), dp(64 * kN, 0.0);
    const auto product = [&](std::vector<double>& d, uint32_t a_base, uint32_t b_tile, int kdim) {
      for (int kk = 0; kk < kdim / 16; ++kk) {
        const uint64_t a = KMajorDescriptor(a_base + rows, kM * kRowBytes, kk);
        const uint64_t b = KMajorDescriptor(b_tile, kN * kRowBytes, kk);
        for (int m = 0; m < 64; ++m) {
          for (int n = 0; n < kN; ++n) {
            for (int kx = 0; kx < 16; ++kx) {
              d[m * kN + n] += smem.At(KMajorAddress(a, m, kx)) * smem.At(KMajorAddress(b, n, kx));
            }
          }
        }
      }
    };
    product(s, q_base, k_tile, dqk);
    product(dp, do_base, v_tile, kDv);
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < kN; ++n) {
        double ws = 0.0, wdp = 0.0;
        for (int c = 0; c < dqk; ++c) ws += q[(64 * consumer + m) * dqk + c] * k[n * dqk + c];
        for (int c = 0; c < kDv; ++c) wdp += d_o[(64 * consumer + m) * kDv + c] * v[n * kDv + c];
        ASSERT_EQ(s[m * kN + n], ws) << "S (" << m << ", " << n << ")";
        ASSERT_EQ(dp[m * kN + n], wdp) << "dP (" << m << ", " << n << ")";
      }
    }
    // dQ = dS K with dS = S - dP standing in for the elementwise step (IssueDsK).
    std::vector<double> ds(64 * kN), dq(64 * dqk, 0.0);
    for (int i = 0; i < 64 * kN; ++i) ds[i] = s[i] - dp[i];
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint64_t b = MnMajorDescriptor(k_tile, kN, kk);
      std::vector<double> a(64 * 16, -1e9);
      for (int w = 0; w < 4; ++w) {
        for (int l = 0; l < 32; ++l) {
          for (int j = 0; j < 4; ++j) {
            for (int h = 0; h < 2; ++h) {
              const int i = AccumulatorOfA(kk, j, h);
              a[FragARow(w, l, j) * 16 + FragACol(l, j, h)] =
                  ds[AccRow(w, l, i) * kN + AccCol(l, i)];
            }
          }
        }
      }
      for (int m = 0; m < 64; ++m) {
        for (int n = 0; n < dqk; ++n) {
          for (int kx = 0; kx < 16; ++kx) {
            dq[m * dqk + n] += a[m * 16 + kx] * smem.At(MnMajorAddress(b, kx, n));
          }
        }
      }
    }
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < dqk; ++n) {
        double want = 0.0;
        for (int c = 0; c < kN; ++c) want += ds[m * kN + c] * k[c * dqk + n];
        ASSERT_EQ(dq[m * dqk + n], want) << "dQ (" << m << ", " << n << ")";
      }
    }
  }
}

TEST(WgmmaLayout, DqPassProductsThroughTheDescriptors) {
  CheckDqProducts(192);
  CheckDqProducts(128);
}

// The dk/dv pass's products (attention_backward_dkdv_wgmma.cu) through its descriptors: S^T =
// K Q^T and dP^T = V dO^T with the CTA's 64 keys as M and a 64-query stage as N, then
// dV = P^T dO and dK = dS^T Q with the stage's dO and Q read transposed (N = 128, dqk).
void CheckDkDvProducts(int dqk) {
  SCOPED_TRACE("dk/dv pass, dqk " + std::to_string(dqk));
  constexpr int kKeys = 64, kQ = 64, kDv = 128;
  PhiloxGenerator rng(static_cast<uint64_t>(dqk) + 11, 0);
  const std::vector<double> k = Random(kKeys * dqk, rng), v = Random(kKeys * kDv, rng),
                            q = Random(kQ * dqk, rng), d_o = Random(kQ * kDv, rng);
  const uint32_t k_base = 0, v_base = kKeys * dqk * 2, ring = v_base + kKeys * kDv * 2;
  const uint32_t stage = ring + (kQ * dqk * 2 + kQ * kDv * 2);  // stage 1 of the ring
  const uint32_t do_tile = stage + kQ * dqk * 2;
  ASSERT_EQ(stage % 1024, 0u);
  ASSERT_EQ(do_tile % 1024, 0u);
  Smem smem;
  smem.Store(k_base, kKeys, dqk, k);
  smem.Store(v_base, kKeys, kDv, v);
  smem.Store(stage, kQ, dqk, q);
  smem.Store(do_tile, kQ, kDv, d_o);
  // IssueScores: A = the key tile (64 rows), B = the stage's tile (64 rows), both K-major.
  const auto scores = [&](uint32_t a_tile, uint32_t b_tile, int kdim) {
    std::vector<double> d(kKeys * kQ, 0.0);
    for (int kk = 0; kk < kdim / 16; ++kk) {
      const uint64_t a = KMajorDescriptor(a_tile, kKeys * kRowBytes, kk);
      const uint64_t b = KMajorDescriptor(b_tile, kQ * kRowBytes, kk);
      for (int m = 0; m < kKeys; ++m) {
        for (int n = 0; n < kQ; ++n) {
          for (int kx = 0; kx < 16; ++kx) {
            d[m * kQ + n] += smem.At(KMajorAddress(a, m, kx)) * smem.At(KMajorAddress(b, n, kx));
          }
        }
      }
    }
    return d;
  };
  const std::vector<double> st = scores(k_base, stage, dqk), dpt = scores(v_base, do_tile, kDv);
  for (int m = 0; m < kKeys; ++m) {
    for (int n = 0; n < kQ; ++n) {
      double ws = 0.0, wdp = 0.0;
      for (int c = 0; c < dqk; ++c) ws += k[m * dqk + c] * q[n * dqk + c];
      for (int c = 0; c < kDv; ++c) wdp += v[m * kDv + c] * d_o[n * kDv + c];
      ASSERT_EQ(st[m * kQ + n], ws) << "S^T (" << m << ", " << n << ")";
      ASSERT_EQ(dpt[m * kQ + n], wdp) << "dP^T (" << m << ", " << n << ")";
    }
  }
  // IssueAccumulate: the scores' accumulators as A fragments (AccumulatorsAsA), B read
  // transposed from the stage.
  const auto accumulate = [&](const std::vector<double>& x, uint32_t b_tile, int ncols) {
    std::vector<double> d(kKeys * ncols, 0.0);
    for (int kk = 0; kk < kQ / 16; ++kk) {
      const uint64_t b = MnMajorDescriptor(b_tile, kQ, kk);
      std::vector<double> a(64 * 16, -1e9);
      for (int w = 0; w < 4; ++w) {
        for (int l = 0; l < 32; ++l) {
          for (int j = 0; j < 4; ++j) {
            for (int h = 0; h < 2; ++h) {
              const int i = AccumulatorOfA(kk, j, h);
              a[FragARow(w, l, j) * 16 + FragACol(l, j, h)] =
                  x[AccRow(w, l, i) * kQ + AccCol(l, i)];
            }
          }
        }
      }
      for (int m = 0; m < kKeys; ++m) {
        for (int n = 0; n < ncols; ++n) {
          for (int kx = 0; kx < 16; ++kx) {
            d[m * ncols + n] += a[m * 16 + kx] * smem.At(MnMajorAddress(b, kx, n));
          }
        }
      }
    }
    return d;
  };
  const std::vector<double> dv = accumulate(st, do_tile, kDv), dk = accumulate(dpt, stage, dqk);
  for (int m = 0; m < kKeys; ++m) {
    for (int n = 0; n < kDv; ++n) {
      double want = 0.0;
      for (int c = 0; c < kQ; ++c) want += st[m * kQ + c] * d_o[c * kDv + n];
      ASSERT_EQ(dv[m * kDv + n], want) << "dV (" << m << ", " << n << ")";
    }
    for (int n = 0; n < dqk; ++n) {
      double want = 0.0;
      for (int c = 0; c < kQ; ++c) want += dpt[m * kQ + c] * q[c * dqk + n];
      ASSERT_EQ(dk[m * dqk + n], want) << "dK (" << m << ", " << n << ")";
    }
  }
}

TEST(WgmmaLayout, DkDvPassProductsThroughTheDescriptors) {
  CheckDkDvProducts(192);
  CheckDkDvProducts(128);
}

// Visibility: the wgmma kernels' CTAs (128 query rows, key tiles of `tile` (128 in the forward, 64
// in the dq pass) from the first query's document start, per-element masks on tiles not wholly
// visible; no skips) compute every visible pair once and no hidden one (padding rows past n are
// never written and not counted).
void CheckVisibility(const std::vector<int64_t>& lengths, int tile) {
  using attention_tc::ClampToTile;
  using attention_tc::DocStart;
  using attention_tc::KeyTiles;
  using attention_tc::KeyTileWhollyVisible;
  constexpr int kRows = 128;
  const int kTile = tile;
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  const int64_t n = cu.back(), entries = static_cast<int64_t>(cu.size());
  SCOPED_TRACE("n " + std::to_string(n) + ", key tile " + std::to_string(tile));
  const auto start = [&](int64_t i) { return DocStart(cu.data(), entries, n, i); };
  const int64_t width = n + kTile;  // keys padded: a tile may run past n
  std::vector<int> count(static_cast<size_t>(n * width), 0);
  for (int64_t q0 = 0; q0 < n; q0 += kRows) {
    const int64_t q_last = std::min<int64_t>(q0 + kRows, n) - 1;
    const int64_t kv_begin = start(q0), last_start = start(q_last);
    for (int it = 0; it < KeyTiles(kv_begin, q_last, kTile); ++it) {
      const int64_t kb = kv_begin + int64_t{it} * kTile;
      const bool wholly = KeyTileWhollyVisible(kb, kTile, q0, last_start);
      for (int64_t row = q0; row < std::min(q0 + kRows, n); ++row) {
        const int lo = ClampToTile(start(row) - kb, kTile), hi = ClampToTile(row - kb, kTile);
        for (int c = 0; c < kTile; ++c) {
          if (wholly || (lo <= c && c <= hi)) ++count[row * width + kb + c];
        }
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < width; ++j) {
      const bool visible = j < n && j <= i && start(i) == start(j);
      ASSERT_EQ(count[i * width + j], visible ? 1 : 0) << "query " << i << " key " << j;
    }
  }
}

// The dk/dv pass's CTAs (64 keys, 64-query tiles from k0 to the end of the last key's document,
// per-element masks on tiles not wholly visible) compute every visible pair once and no hidden
// one (padding keys past n are never written and not counted).
void CheckKeyVisibility(const std::vector<int64_t>& lengths) {
  using attention_tc::ClampToTile;
  using attention_tc::DocOf;
  using attention_tc::DocStart;
  using attention_tc::QueryTiles;
  using attention_tc::QueryTileWhollyVisible;
  constexpr int kKeys = 64, kTile = 64;
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  const int64_t n = cu.back(), entries = static_cast<int64_t>(cu.size());
  SCOPED_TRACE("dk/dv pass, n " + std::to_string(n));
  const auto start = [&](int64_t i) { return DocStart(cu.data(), entries, n, i); };
  const int64_t height = n + kTile;  // queries padded: a tile may run past n
  std::vector<int> count(static_cast<size_t>(height * n), 0);
  for (int64_t k0 = 0; k0 < n; k0 += kKeys) {
    const int64_t k_last = std::min<int64_t>(k0 + kKeys, n) - 1;
    const int64_t q_stop = std::min(cu[DocOf(cu.data(), entries, k_last) + 1], n);
    for (int it = 0; it < QueryTiles(k0, q_stop, kTile); ++it) {
      const int64_t qb = k0 + int64_t{it} * kTile;
      const int lo_last = ClampToTile(start(qb + kTile - 1) - k0, kKeys);
      const bool wholly = QueryTileWhollyVisible(qb, k0, kKeys, lo_last);
      for (int key = 0; key < kKeys && k0 + key < n; ++key) {
        for (int c = 0; c < kTile; ++c) {
          const int64_t i = qb + c;
          const int lo = ClampToTile(start(i) - k0, kKeys), hi = ClampToTile(i - k0, kKeys);
          if (wholly || (lo <= key && key <= hi)) ++count[i * n + k0 + key];
        }
      }
    }
  }
  for (int64_t i = 0; i < height; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const bool visible = i < n && j <= i && start(i) == start(j);
      ASSERT_EQ(count[i * n + j], visible ? 1 : 0) << "query " << i << " key " << j;
    }
  }
}

// The forward with PrefixRows (PrefixCausalAttention: queries the last n_d positions of a
// document's L_d keys, packed apart): every visible pair once, no hidden one, no key tile past the
// padded keys. Visibility from the definition: query i of document d sees the document's keys 0
// .. L_d - n_d + (i - cu_q[d]).
void CheckPrefixVisibility(const std::vector<int64_t>& queries, const std::vector<int64_t>& keys) {
  using attention_tc::ClampToTile;
  using attention_tc::KeyTiles;
  using attention_tc::KeyTileWhollyVisible;
  using attention_tc::PrefixRows;
  constexpr int kRows = 128, kTile = 128;
  std::vector<int64_t> cu_q = {0}, cu_k = {0};
  for (size_t d = 0; d < queries.size(); ++d) {
    cu_q.push_back(cu_q.back() + queries[d]);
    cu_k.push_back(cu_k.back() + keys[d]);
  }
  const int64_t nq = cu_q.back(), nk = cu_k.back();
  SCOPED_TRACE("prefix, nq " + std::to_string(nq) + " nk " + std::to_string(nk));
  const PrefixRows rows{cu_q.data(), cu_k.data(), static_cast<int64_t>(cu_q.size()), nq};
  const auto visible = [&](int64_t i, int64_t j) {
    for (size_t d = 0; d + 1 < cu_q.size(); ++d) {
      if (i < cu_q[d] || i >= cu_q[d + 1]) continue;
      const int64_t n = cu_q[d + 1] - cu_q[d], len = cu_k[d + 1] - cu_k[d];
      return j >= cu_k[d] && j - cu_k[d] <= len - n + (i - cu_q[d]);
    }
    return false;
  };
  const int64_t width = nk + kTile;
  std::vector<int> count(static_cast<size_t>(nq * width), 0);
  for (int64_t q0 = 0; q0 < nq; q0 += kRows) {
    const int64_t q_last = std::min<int64_t>(q0 + kRows, nq) - 1;
    const int64_t kv_begin = rows.First(q0), last_start = rows.First(q_last);
    const int64_t first_end = rows.Last(q0);
    for (int it = 0; it < KeyTiles(kv_begin, rows.Last(q_last), kTile); ++it) {
      const int64_t kb = kv_begin + int64_t{it} * kTile;
      const bool wholly = KeyTileWhollyVisible(kb, kTile, first_end, last_start);
      for (int64_t row = q0; row <= q_last; ++row) {
        const int lo = ClampToTile(rows.First(row) - kb, kTile);
        const int hi = ClampToTile(rows.Last(row) - kb, kTile);
        for (int c = 0; c < kTile; ++c) {
          if (!(wholly || (lo <= c && c <= hi))) continue;
          ASSERT_LT(kb + c, width) << "a key tile past the padded keys";
          ++count[static_cast<size_t>(row * width + kb + c)];
        }
      }
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t j = 0; j < width; ++j) {
      ASSERT_EQ(count[static_cast<size_t>(i * width + j)], visible(i, j) ? 1 : 0)
          << "query " << i << " key " << j;
    }
  }
}

TEST(WgmmaLayout, PrefixTilesCoverEachVisiblePairOnce) {
  // (queries, keys) per document: single queries at the end of long contexts, all-query
  // documents, a document without queries between two with, a 640-query chunk at the end of 9000
  // keys beside a second turn, lengths on no tile boundary.
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> layouts = {
      {{1, 1, 1}, {1, 65, 3000}},
      {{127, 128, 129}, {127, 128, 129}},
      {{3, 0, 70}, {100, 45, 70}},
      {{640, 37}, {9000, 1000}},
      {{1, 70, 0, 3, 130, 0, 64}, {200, 70, 0, 9, 131, 5, 64}},
      {{0, 5, 0}, {3, 9, 0}},
  };
  for (const auto& [q, k] : layouts) CheckPrefixVisibility(q, k);
  PhiloxGenerator rng(93, 0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> q(1 + rng.UniformInt(6)), k(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      k[i] = static_cast<int64_t>(rng.UniformInt(trial % 2 ? 20 : 400));
      q[i] = k[i] == 0 ? 0 : static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(k[i]) + 1));
    }
    CheckPrefixVisibility(q, k);
  }
}

TEST(WgmmaLayout, TilesCoverEachVisiblePairOnce) {
  for (const auto& lengths :
       std::vector<std::vector<int64_t>>{{1, 63, 64, 65, 200, 1, 130, 17},
                                         {1, 7, 130, 0, 300, 45, 32, 65, 1100},
                                         {128, 128, 256},
                                         {0, 5, 0},
                                         {1},
                                         {127, 0, 129, 31, 33},
                                         {1000, 1, 300}}) {
    CheckVisibility(lengths, 128);  // the forward
    CheckVisibility(lengths, 64);   // the dq pass
    CheckKeyVisibility(lengths);    // the dk/dv pass
  }
  PhiloxGenerator rng(91, 0);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<int64_t> lengths(1 + rng.UniformInt(10));
    for (int64_t& len : lengths) len = static_cast<int64_t>(rng.UniformInt(trial % 2 ? 9 : 400));
    CheckVisibility(lengths, 128);
    CheckVisibility(lengths, 64);
    CheckKeyVisibility(lengths);
  }
}

}  // namespace
}  // namespace orrery::kernels::cuda::wgmma
