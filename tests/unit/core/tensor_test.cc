#include "core/tensor.h"

#include <gtest/gtest.h>

namespace orrery {
namespace {

TEST(TensorTest, ShapeAndData) {
  Tensor t = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.ndim(), 2);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(-1), 3);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.ToString(), "f32[2, 3] on cpu");
  EXPECT_EQ(t.data<float>()[4], 5.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 256, 0u);
}

TEST(TensorTest, SliceSharesStorage) {
  Tensor t = Tensor::FromVector<int32_t>({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  StatusOr<Tensor> s = t.Slice(1, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shape(), (Shape{2, 2}));
  EXPECT_EQ(s->data<int32_t>()[0], 2);
  s->data<int32_t>()[0] = 42;
  EXPECT_EQ(t.data<int32_t>()[2], 42);
  StatusOr<Tensor> empty = t.Slice(4, 4);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_FALSE(t.Slice(3, 5).ok());
  EXPECT_FALSE(t.Slice(-1, 2).ok());
  EXPECT_FALSE(t.Slice(2, 1).ok());
  Tensor scalar = Tensor::Empty({}, DType::kF32);
  EXPECT_FALSE(scalar.Slice(0, 0).ok());
}

TEST(TensorTest, ReshapeCloneCopy) {
  Tensor t = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_FALSE(t.Reshape({4}).ok());
  Tensor r = *t.Reshape({3, 2});
  EXPECT_EQ(r.raw_data(), t.raw_data());
  Tensor c = t.Clone();
  EXPECT_NE(c.raw_data(), t.raw_data());
  c.data<float>()[0] = -1;
  EXPECT_EQ(t.data<float>()[0], 1);
  Tensor z = Tensor::Zeros({6}, DType::kF32);
  ASSERT_TRUE(z.CopyFrom(t).ok());
  EXPECT_EQ(z.data<float>()[5], 6);
  EXPECT_FALSE(z.CopyFrom(Tensor::Zeros({5}, DType::kF32)).ok());
  EXPECT_FALSE(z.CopyFrom(Tensor::Zeros({6}, DType::kI32)).ok());
  ASSERT_TRUE(z.SetZero().ok());
  EXPECT_EQ(z.data<float>()[5], 0);
}

TEST(TensorTest, CastRoundsToNearestEven) {
  Tensor t = Tensor::FromVector<float>({3}, {1.0f, BitsToFloat(0x3f808000u), -3.5f});
  Tensor b = *t.Cast(DType::kBF16);
  EXPECT_EQ(b.data<BFloat16>()[1].bits, 0x3f80);
  Tensor back = *b.Cast(DType::kF32);
  EXPECT_EQ(back.data<float>()[2], -3.5f);
  Tensor i = *t.Cast(DType::kI64);
  EXPECT_EQ(i.data<int64_t>()[2], -3);
  Tensor big = Tensor::FromVector<int64_t>({1}, {(int64_t{1} << 53) + 1});
  EXPECT_EQ(big.Cast(DType::kI64)->data<int64_t>()[0], (int64_t{1} << 53) + 1);
}

TEST(TensorTest, DevicesWithoutGpu) {
  EXPECT_TRUE(ParseDevice("cpu").ok());
  EXPECT_EQ(ParseDevice("cuda:3")->index, 3);
  EXPECT_FALSE(ParseDevice("tpu").ok());
  EXPECT_FALSE(ParseDevice("cuda:x").ok());
  if (CudaDeviceCount() == 0) {
    StatusOr<Tensor> t = Tensor::Allocate({4}, DType::kF32, Device::Cuda(0));
    EXPECT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_FALSE(Tensor::Allocate({-1}, DType::kF32, Device::Cpu()).ok());
}

TEST(TensorTest, CudaRoundTripWhenAvailable) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no GPU";
  Tensor t = Tensor::FromVector<float>({3}, {1, 2, 3});
  Tensor g = *t.To(Device::Cuda(0));
  EXPECT_TRUE(g.device().is_cuda());
  Tensor back = *g.To(Device::Cpu());
  EXPECT_EQ(back.data<float>()[2], 3);
}

TEST(DTypeTest, Names) {
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(*ParseDType("bool"), DType::kBool);
  EXPECT_EQ(*ParseSafetensorsDType("BF16"), DType::kBF16);
  EXPECT_FALSE(ParseSafetensorsDType("F8_E4M3").ok());
}

}  // namespace
}  // namespace orrery
