// The fixed summation order of the GPU ops' cross-block reductions
// (kernels/cuda/column_sums_order.h) on the CPU: its tiles, its host twin against an f64 sum, and
// that the twin follows exactly the documented order (which the GPU test holds the kernel to, bit
// for bit).
#include "kernels/cuda/column_sums_order.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/philox.h"

namespace orrery::kernels::cuda {
namespace {

TEST(ColumnSumsOrderTest, TilesKeepWarpsOnRowsAndNarrowSumsOnManyLanes) {
  EXPECT_EQ(ColumnSumTile(1), 1);
  EXPECT_EQ(ColumnSumTile(7), 8);
  EXPECT_EQ(ColumnSumTile(32), 32);
  EXPECT_EQ(ColumnSumTile(33), 32);
  EXPECT_EQ(ColumnSumTile(100000), 32);
  EXPECT_EQ(ColumnSumLanes(1), kColumnSumThreads);
  EXPECT_EQ(ColumnSumLanes(7), kColumnSumThreads / 8);
  EXPECT_EQ(ColumnSumLanes(2048), kColumnSumThreads / 32);
  for (int64_t cols : {1, 2, 3, 5, 9, 31, 32, 1000}) {
    EXPECT_EQ(ColumnSumTile(cols) * ColumnSumLanes(cols), kColumnSumThreads) << cols;
  }
}

// Against an f64 sum of the same values. An f32 sum of R standard normals errs by at most about
// R half-ulps of partial sums of size ~sqrt(R) (far less in practice): 4e-7 R bounds that loosely,
// while a missed or doubled row errs by ~1.
TEST(ColumnSumsOrderTest, HostTwinSumsEveryRowOfEveryColumn) {
  PhiloxGenerator rng(3, 0);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1056, 70}, {9000, 1}, {5, 7}, {0, 3}}) {
    std::vector<float> parts(rows * cols), out(cols), base(cols);
    for (float& p : parts) p = static_cast<float>(rng.Normal());
    for (float& b : base) b = static_cast<float>(rng.Normal());
    for (bool accumulate : {false, true}) {
      out = base;
      ColumnSumsInOrder(parts.data(), rows, cols, accumulate, out.data());
      for (int64_t c = 0; c < cols; ++c) {
        double want = accumulate ? base[c] : 0.0;
        for (int64_t r = 0; r < rows; ++r) want += parts[r * cols + c];
        EXPECT_NEAR(out[c], want, 4e-7 * static_cast<double>(rows) + 1e-6)
            << rows << " x " << cols << " column " << c;
      }
    }
  }
}

// The documented order, spelled out on a column whose sum depends on it: 1 + 1e8 - 1e8 in f32
// is 0 or 1 depending on which pair is added first.
TEST(ColumnSumsOrderTest, LanesSumStridedRowsThenLanesAddInOrder) {
  const int lanes = ColumnSumLanes(1);
  std::vector<float> parts(static_cast<size_t>(2 * lanes), 0.0f);
  parts[0] = 1e8f;   // lane 0, first row
  parts[lanes] = 1;  // lane 0, second row: lane 0's sum 1e8 + 1 rounds to 1e8
  parts[1] = -1e8f;  // lane 1: its sum -1e8, added after lane 0's
  float out = 0;
  ColumnSumsInOrder(parts.data(), 2 * lanes, 1, false, &out);
  EXPECT_EQ(out, 0.0f);  // (1e8 + 1) - 1e8 in f32; a sequential row sum would give 1
  float seq = 0;
  for (float p : parts) seq += p;
  EXPECT_EQ(seq, 0.0f + (1e8f + -1e8f) + 1.0f);
}

}  // namespace
}  // namespace orrery::kernels::cuda
