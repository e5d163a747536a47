// Matmul's CPU twin (kernels/matmul.h) against the naive triple loop in f64, for every transpose
// combination and an accumulating beta; and its argument checks.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace orrery::kernels
