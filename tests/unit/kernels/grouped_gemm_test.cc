// The grouped GEMMs' CPU twin (kernels/grouped_gemm.h) against kernels::Matmul on each expert's
// row views (an independent product: OpenBLAS), in f64 on ragged counts with empty experts and
// rows outside every expert; the fused GLU's twin against Matmul then Glu; and argument errors.
#include "kernels/grouped_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/philox.h"
#include "kernels/matmul.h"
#include "kernels/situ.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::RandomNormal;
using testing::RelRmsError;

StatusOr<Tensor> ExpertOf(const Tensor& w, int64_t e) {
  ORRERY_ASSIGN_OR_RETURN(Tensor one, w.Slice(e, e + 1));
  return one.Reshape({w.dim(1), w.dim(2)});
}

TEST(GroupedGemmCpuTest, MatchesPerExpertMatmul) {
  // Rows 0-1 and the last 3 belong to no expert; experts 1 and 4 own none.
  const std::vector<int64_t> off = {2, 9, 9, 10, 30, 30, 47};
  const int64_t e = 6, m = 50, n = 12, k = 20;
  PhiloxGenerator rng(51, 0);
  const Tensor x = RandomNormal({m, k}, DType::kF64, rng),
               dy = RandomNormal({m, n}, DType::kF64, rng);
  const Tensor w = RandomNormal({e, n, k}, DType::kF64, rng);
  const Tensor dx0 = RandomNormal({m, k}, DType::kF64, rng);
  const Tensor dw0 = RandomNormal({e, n, k}, DType::kF64, rng);
  for (const bool i64 : {false, true}) {
    std::vector<int32_t> off32(off.begin(), off.end());
    const Tensor offsets = i64 ? Tensor::FromVector<int64_t>({e + 1}, off)
                               : Tensor::FromVector<int32_t>({e + 1}, off32);
    Tensor y = Tensor::Empty({m, n}, DType::kF64), dx = dx0.Clone(), dw = dw0.Clone();
    std::memset(y.raw_data(), 0, y.nbytes());
    ASSERT_TRUE(GroupedGemmForward(x, w, offsets, &y).ok());
    ASSERT_TRUE(GroupedGemmInputGrad(dy, w, offsets, true, &dx).ok());
    ASSERT_TRUE(GroupedGemmWeightGrad(dy, x, offsets, &dw).ok());
    Tensor y_ref = Tensor::Empty({m, n}, DType::kF64), dx_ref = dx0.Clone(), dw_ref = dw0.Clone();
    std::memset(y_ref.raw_data(), 0, y_ref.nbytes());
    for (int64_t i = 0; i < e; ++i) {
      if (off[i + 1] == off[i]) continue;
      const Tensor we = ExpertOf(w, i).value();
      Tensor ye = y_ref.Slice(off[i], off[i + 1]).value();
      Tensor dxe = dx_ref.Slice(off[i], off[i + 1]).value();
      Tensor dwe = ExpertOf(dw_ref, i).value();
      const Tensor xe = x.Slice(off[i], off[i + 1]).value();
      const Tensor ge = dy.Slice(off[i], off[i + 1]).value();
      ASSERT_TRUE(Matmul(xe, we, {false, true, 1.0f, 0.0f}, &ye).ok());
      ASSERT_TRUE(Matmul(ge, we, {false, false, 1.0f, 1.0f}, &dxe).ok());
      ASSERT_TRUE(Matmul(ge, xe, {true, false, 1.0f, 1.0f}, &dwe).ok());
    }
    EXPECT_LE(RelRmsError(y, y_ref), 1e-14);  // f64 sums in two orders
    EXPECT_LE(RelRmsError(dx, dx_ref), 1e-14);
    EXPECT_LE(RelRmsError(dw, dw_ref), 1e-14);
    // Rows outside the experts: y left as it was (0), dx its start.
    for (int64_t r : {0, 1, 47, 48, 49}) {
      for (int64_t c = 0; c < k; ++c) {
        EXPECT_EQ(dx.data<double>()[r * k + c], dx0.data<double>()[r * k + c]) << "row " << r;
      }
      EXPECT_EQ(y.data<double>()[r * n], 0.0) << "row " << r;
    }
  }
}

// GroupedGemmGlu's twin against per-expert Matmul of W1 and W3 followed by the Glu op, for SiTU
// and SiLU, with and without the pre-activations; rows outside the experts left alone.
TEST(GroupedGemmCpuTest, GluMatchesMatmulThenGlu) {
  const std::vector<int64_t> off = {1, 6, 6, 19, 30};
  const int64_t e = 4, m = 33, f = 10, k = 14;
  PhiloxGenerator rng(52, 0);
  const Tensor x = RandomNormal({m, k}, DType::kF64, rng);
  const Tensor w1 = RandomNormal({e, f, k}, DType::kF64, rng, 0.8);
  const Tensor w3 = RandomNormal({e, f, k}, DType::kF64, rng, 0.8);
  const Tensor offsets = Tensor::FromVector<int64_t>({e + 1}, off);
  for (const bool situ : {true, false}) {
    GluActivation act;
    act.situ = situ;
    act.beta = 2.0;
    act.beta_lin = 3.0;
    Tensor a_ref = Tensor::Empty({m, f}, DType::kF64), u_ref = Tensor::Empty({m, f}, DType::kF64);
    Tensor h_ref = Tensor::Empty({m, f}, DType::kF64);
    for (int64_t i = 0; i < e; ++i) {
      if (off[i + 1] == off[i]) continue;
      const Tensor xe = x.Slice(off[i], off[i + 1]).value();
      Tensor ae = a_ref.Slice(off[i], off[i + 1]).value();
      Tensor ue = u_ref.Slice(off[i], off[i + 1]).value();
      ASSERT_TRUE(Matmul(xe, ExpertOf(w1, i).value(), {false, true, 1.0f, 0.0f}, &ae).ok());
      ASSERT_TRUE(Matmul(xe, ExpertOf(w3, i).value(), {false, true, 1.0f, 0.0f}, &ue).ok());
      Tensor he = h_ref.Slice(off[i], off[i + 1]).value();
      ASSERT_TRUE(Glu(act, ae, ue, &he).ok());
    }
    for (const bool pre : {false, true}) {
      Tensor h = Tensor::Empty({m, f}, DType::kF64), a = Tensor::Empty({m, f}, DType::kF64);
      Tensor u = Tensor::Empty({m, f}, DType::kF64);
      for (Tensor* t : {&h, &a, &u}) {
        for (int64_t i = 0; i < m * f; ++i) t->data<double>()[i] = 7.0;  // outside rows stay 7
      }
      ASSERT_TRUE(
          GroupedGemmGlu(act, x, w1, w3, offsets, &h, pre ? &a : nullptr, pre ? &u : nullptr).ok());
      for (int64_t r = 0; r < m; ++r) {
        const bool inside = r >= off.front() && r < off.back();
        for (int64_t c = 0; c < f; ++c) {
          const int64_t i = r * f + c;
          if (!inside) {
            ASSERT_EQ(h.data<double>()[i], 7.0) << "row " << r << " outside the experts written";
            continue;
          }
          EXPECT_NEAR(h.data<double>()[i], h_ref.data<double>()[i],
                      1e-12 * (1 + std::abs(h_ref.data<double>()[i])))
              << (situ ? "situ" : "silu") << " row " << r << " col " << c;
          if (pre) {
            EXPECT_NEAR(a.data<double>()[i], a_ref.data<double>()[i], 1e-12);
            EXPECT_NEAR(u.data<double>()[i], u_ref.data<double>()[i], 1e-12);
          }
        }
      }
    }
  }
  Tensor h, a;
  const Status st = GroupedGemmGlu(GluActivation(), x, w1, w3, offsets, &h, &a, nullptr);
  EXPECT_EQ(st.message(), "grouped_gemm_glu: a and u: both or neither");
}

TEST(GroupedGemmCpuTest, BadArgumentsAreOneClearLine) {
  const Tensor x = Tensor::Empty({4, 8}, DType::kF64), w = Tensor::Empty({2, 6, 8}, DType::kF64);
  const Tensor off = Tensor::FromVector<int64_t>({3}, {0, 2, 4});
  Tensor y;
  Status st = GroupedGemmForward(x, w, Tensor::FromVector<int64_t>({2}, {0, 4}), &y);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("grouped_gemm_forward: offsets i64[2]", 0), 0u) << st.ToString();
  st = GroupedGemmForward(Tensor::Empty({4, 8}, DType::kF32), w, off, &y);
  EXPECT_EQ(st.message().rfind("grouped_gemm_forward: w f64[2, 6, 8] on cpu, expected f32", 0), 0u)
      << st.ToString();
  st = GroupedGemmForward(Tensor::Empty({4, 7}, DType::kF64), w, off, &y);
  EXPECT_EQ(st.message().rfind("grouped_gemm_forward: x f64[4, 7] on cpu, expected f64[4, 8]", 0),
            0u)
      << st.ToString();
  Tensor dx;
  st = GroupedGemmInputGrad(Tensor::Empty({4, 6}, DType::kF64), w, off, true, &dx);
  EXPECT_EQ(st.message(), "grouped_gemm_input_grad: dx is undefined but accumulate is set");
}

}  // namespace
}  // namespace orrery::kernels
