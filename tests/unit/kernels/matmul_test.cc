// Matmul's CPU twin (kernels/matmul.h) against the naive triple loop in f64, for every transpose
// combination and an accumulating beta; and its argument checks.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/philox.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

Tensor Normal(const Shape& shape, PhiloxGenerator& rng) {
  return testing::RandomNormal(shape, DType::kF64, rng);
}

TEST(MatmulTest, CpuTwinMatchesNaiveLoops) {
  const int64_t m = 7, n = 5, k = 9;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      PhiloxGenerator rng(ta * 2 + tb, 0);
      const Tensor a = Normal(ta ? Shape{k, m} : Shape{m, k}, rng);
      const Tensor b = Normal(tb ? Shape{n, k} : Shape{k, n}, rng);
      Tensor c = Normal({m, n}, rng);
      const Tensor c0 = c.Clone();
      MatmulOptions o{ta == 1, tb == 1, 0.5f, 2.0f};
      ASSERT_TRUE(Matmul(a, b, o, &c).ok());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t l = 0; l < k; ++l) {
            const double av = ta ? a.data<double>()[l * m + i] : a.data<double>()[i * k + l];
            const double bv = tb ? b.data<double>()[j * k + l] : b.data<double>()[l * n + j];
            s += av * bv;
          }
          EXPECT_NEAR(c.data<double>()[i * n + j], 0.5 * s + 2.0 * c0.data<double>()[i * n + j],
                      1e-12)
              << ta << tb << " " << i << "," << j;
        }
      }
    }
  }
}

TEST(MatmulTest, AllocatesAnUndefinedOutput) {
  PhiloxGenerator rng(9, 0);
  const Tensor a = Normal({3, 4}, rng).Cast(DType::kF32).value();
  const Tensor b = Normal({4, 2}, rng).Cast(DType::kF32).value();
  Tensor c;
  ASSERT_TRUE(Matmul(a, b, {}, &c).ok());
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(c.dtype(), DType::kF32);
}

TEST(MatmulTest, BadShapesAreOneClearError) {
  const Tensor a = Tensor::Zeros({3, 4}, DType::kF32), b = Tensor::Zeros({5, 2}, DType::kF32);
  Tensor c;
  Status st = Matmul(a, b, {}, &c);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "matmul: inner dimensions differ: op(a) f32[3, 4] on cpu has 4, op(b) f32[5, 2] on "
            "cpu has 5");
  c = Tensor();
  EXPECT_FALSE(Matmul(a, Tensor::Zeros({4, 2}, DType::kF32), {false, false, 1.0f, 1.0f}, &c).ok())
      << "beta != 0 needs a defined c";
  c = Tensor::Zeros({3, 2}, DType::kF64);
  EXPECT_FALSE(Matmul(a, Tensor::Zeros({4, 2}, DType::kF32), {}, &c).ok()) << "mixed dtypes";
}

// The strided-batched form on the absorbed MLA's layout: per head h, a_h = the columns
// [h * w, h * w + dn) of an [n, H * w] activation, b_h = rows [h * (dn + dv), ..) of a stacked
// weight (transposed or not), c_h = columns of an [n, H * out] output; against naive loops in f64,
// with the untouched elements of c left alone.
TEST(MatmulTest, StridedBatchedMatchesNaiveLoopsOnColumnBlocks) {
  const int64_t n = 5, heads = 3, w = 11, dn = 4, dv = 6, out = 7;
  for (int tb = 0; tb < 2; ++tb) {
    PhiloxGenerator rng(40 + tb, 0);
    const Tensor x = Normal({n, heads * w}, rng);
    // b_h stored [dn, out] (tb = 0) or [out, dn] (tb = 1) at rows h * (dn + dv) of a stack.
    const int64_t b_rows = tb ? out : dn, b_cols = tb ? dn : out;
    const Tensor stack = Normal({heads * (dn + dv) + 2, b_cols}, rng);
    Tensor c = Normal({n, heads * out + 3}, rng);
    const Tensor c0 = c.Clone();
    const MatrixBatch a{x, 1, n, dn, heads * w, w};
    const MatrixBatch b{stack, 0, b_rows, b_cols, b_cols, (dn + dv) * b_cols};
    const MatrixBatch cb{c, 2, n, out, heads * out + 3, out};
    MatmulOptions o{false, tb == 1, 1.5f, 0.5f};
    ASSERT_TRUE(MatmulStridedBatched(a, b, heads, o, cb).ok());
    const double* xp = x.data<double>();
    const double* sp = stack.data<double>();
    std::vector<bool> written(static_cast<size_t>(c.numel()), false);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < out; ++j) {
          double sum = 0;
          for (int64_t l = 0; l < dn; ++l) {
            const double av = xp[1 + h * w + i * heads * w + l];
            const double* bh = sp + h * (dn + dv) * b_cols;
            const double bv = tb ? bh[j * b_cols + l] : bh[l * b_cols + j];
            sum += av * bv;
          }
          const int64_t at = 2 + h * out + i * (heads * out + 3) + j;
          written[static_cast<size_t>(at)] = true;
          EXPECT_NEAR(c.data<double>()[at], 1.5 * sum + 0.5 * c0.data<double>()[at], 1e-12)
              << tb << " head " << h << " " << i << "," << j;
        }
      }
    }
    for (int64_t e = 0; e < c.numel(); ++e) {
      if (!written[static_cast<size_t>(e)]) {
        EXPECT_EQ(c.data<double>()[e], c0.data<double>()[e]) << "element " << e;
      }
    }
  }
}

TEST(MatmulTest, StridedBatchedRefusesMatricesOutsideTheirTensor) {
  const Tensor a = Tensor::Zeros({4, 8}, DType::kF32), b = Tensor::Zeros({8, 8}, DType::kF32);
  const Tensor c = Tensor::Zeros({4, 8}, DType::kF32);
  // Two 4 x 4 blocks of c at stride 4 fit; three do not.
  const MatrixBatch ab{a, 0, 4, 4, 8, 4}, bb{b, 0, 4, 4, 8, 4}, cb{c, 0, 4, 4, 8, 4};
  EXPECT_TRUE(MatmulStridedBatched(ab, bb, 2, {}, cb).ok());
  const Status st = MatmulStridedBatched(ab, bb, 3, {}, cb);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("reach element"), std::string::npos) << st.message();
  const MatrixBatch bad_ld{a, 0, 4, 4, 3, 4};
  EXPECT_FALSE(MatmulStridedBatched(bad_ld, bb, 1, {}, cb).ok());
}

}  // namespace
}  // namespace orrery::kernels
