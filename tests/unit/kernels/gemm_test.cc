// Gemm against a naive f64 product, and its split over the thread pool: every row of C must come
// out bit-identical whatever the pool's size (what makes CPU training reproducible across machines
// and [run] threads settings).
#include "kernels/gemm.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/philox.h"
#include "core/thread_pool.h"

namespace orrery::kernels {
namespace {

std::vector<float> Randn(int64_t n, uint64_t seed) {
  PhiloxGenerator g(seed, 0);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(g.Normal());
  return v;
}

struct Shape {
  bool ta, tb;
  int64_t m, n, k;
};

std::vector<float> Product(const Shape& s, const std::vector<float>& a,
                           const std::vector<float>& b) {
  std::vector<float> c(static_cast<size_t>(s.m * s.n), 0.5f);
  Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), s.ta ? s.m : s.k, b.data(), s.tb ? s.k : s.n,
       0.25f, c.data(), s.n);
  return c;
}

TEST(GemmTest, SplitProductsMatchANaiveProductAndNeverDependOnThePoolSize) {
  ::unsetenv("ORRERY_NUM_THREADS");  // this test sizes the pool itself
  // Large enough to be split over the pool (>= 2^20 multiply-adds, more than one block of rows),
  // with row counts that are not multiples of the block.
  const std::vector<Shape> shapes = {{false, false, 517, 256, 64},
                                     {false, true, 300, 96, 128},
                                     {true, false, 1000, 40, 70},
                                     {true, true, 129, 512, 33}};
  for (const Shape& s : shapes) {
    const std::vector<float> a = Randn(s.m * s.k, 1), b = Randn(s.k * s.n, 2);
    ThreadPool::SetDefaultThreads(1);
    const std::vector<float> one = Product(s, a, b);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double want = 0.25 * 0.5;
        for (int64_t p = 0; p < s.k; ++p) {
          const double x = a[static_cast<size_t>(s.ta ? p * s.m + i : i * s.k + p)];
          const double y = b[static_cast<size_t>(s.tb ? j * s.k + p : p * s.n + j)];
          want += x * y;
        }
        // f32 accumulation over k <= 128 terms of unit normals: error well below 1e-3.
        ASSERT_NEAR(one[static_cast<size_t>(i * s.n + j)], want, 1e-3) << i << "," << j;
      }
    }
    for (int threads : {2, 3, 5}) {
      ThreadPool::SetDefaultThreads(threads);
      const std::vector<float> many = Product(s, a, b);
      EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)))
          << s.m << "x" << s.n << "x" << s.k << " with " << threads << " threads";
    }
  }
  ThreadPool::SetDefaultThreads(0);
}

}  // namespace
}  // namespace orrery::kernels
