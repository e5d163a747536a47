// The fused LM head + cross-entropy's CPU twin (kernels/lm_head_loss.h): its gradients against
// central finite differences of its own loss in f64 (chunks of 2 rows over 5, so a partial last
// chunk), its loss against kernels/cross_entropy.h on the full logits, and its argument checks.
// The CUDA path is checked against this twin in tests/gpu/ops_gpu_test.cc.
#include "kernels/lm_head_loss.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/philox.h"
#include "kernels/cross_entropy.h"
#include "kernels/matmul.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

Tensor Normal(const Shape& shape, PhiloxGenerator& rng) {
  return testing::RandomNormal(shape, DType::kF64, rng);
}

TEST(LmHeadLossTest, GradientsMatchFiniteDifferencesAndLossMatchesCrossEntropy) {
  const int64_t n = 5, d = 3, v = 7;
  PhiloxGenerator rng(21, 0);
  Tensor x = Normal({n, d}, rng), w = Normal({v, d}, rng);
  const Tensor targets = Tensor::FromVector<int32_t>({n}, {3, 0, 6, 6, 2});
  const Tensor mask = Tensor::FromVector<float>({n}, {1.0f, 0.5f, 0.0f, 2.0f, 1.0f});
  LmHeadLossOptions o;
  o.chunk_rows = 2;
  o.grad_scale = 0.75;
  double loss = 0;
  Tensor dx, dw = Tensor::Zeros({v, d}, DType::kF64);
  ASSERT_TRUE(LmHeadCrossEntropy(x, w, targets, mask, o, &loss, &dx, &dw).ok());

  // The loss against the masked mean of kernels/cross_entropy.h times the mask's sum (4.5).
  Tensor logits;
  ASSERT_TRUE(Matmul(x, w, {false, true, 1.0f, 0.0f}, &logits).ok());
  const StatusOr<double> mean = MaskedCrossEntropy(logits, targets, mask, nullptr);
  ASSERT_TRUE(mean.ok());
  EXPECT_NEAR(loss, *mean * 4.5, 1e-12);

  auto loss_at = [&](const Tensor& xx, const Tensor& ww) {
    double l = 0;
    EXPECT_TRUE(LmHeadCrossEntropy(xx, ww, targets, mask, o, &l, nullptr, nullptr).ok());
    return l;
  };
  const double h = 1e-6;
  for (auto [t, g] : {std::pair<Tensor*, Tensor*>{&x, &dx}, {&w, &dw}}) {
    for (int64_t i = 0; i < t->numel(); ++i) {
      double* p = t->data<double>() + i;
      const double keep = *p;
      *p = keep + h;
      const double up = loss_at(x, w);
      *p = keep - h;
      const double down = loss_at(x, w);
      *p = keep;
      EXPECT_NEAR(g->data<double>()[i], o.grad_scale * (up - down) / (2 * h), 1e-7) << i;
    }
  }
  // The masked-out row contributes nothing to dx.
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(dx.data<double>()[2 * d + j], 0.0);
}

TEST(LmHeadLossTest, BadInputIsOneClearError) {
  const Tensor x = Tensor::Zeros({2, 3}, DType::kF32), w = Tensor::Zeros({4, 3}, DType::kF32);
  double loss = 0;
  Status st = LmHeadCrossEntropy(x, w, Tensor::FromVector<int32_t>({2}, {1, 4}), Tensor(), {},
                                 &loss, nullptr, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "lm_head_loss: targets[1] = 4, expected [0, 4)");
  st = LmHeadCrossEntropy(x, w, Tensor::FromVector<int32_t>({1}, {1}), Tensor(), {}, &loss, nullptr,
                          nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "lm_head_loss: targets i32[1] on cpu, expected i32[2] on cpu");
  st = LmHeadCrossEntropy(x, Tensor::Zeros({4, 2}, DType::kF32), Tensor(), Tensor(), {}, &loss,
                          nullptr, nullptr);
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace orrery::kernels
