// Row gathers / scatters by index and column-block copies (kernels/rows.h) on the CPU: the values
// land where the contract says, any dtype, and bad indices or ranges are one clear error.
#include "kernels/rows.h"

#include <gtest/gtest.h>

namespace orrery::kernels {
namespace {

TEST(RowsTest, GatherAndScatterMoveWholeRows) {
  // src [4, 2, 3] f32 with value 100 * row + i.
  std::vector<float> v;
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 6; ++i) v.push_back(100.0f * r + i);
  }
  Tensor src = Tensor::FromVector<float>({4, 2, 3}, v);
  Tensor index = Tensor::FromVector<int32_t>({3}, {2, 0, 3});
  Tensor got;
  ASSERT_TRUE(GatherRows(src, index, &got).ok());
  ASSERT_EQ(got.shape(), (Shape{3, 2, 3}));
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(got.data<float>()[j * 6 + i], 100.0f * index.data<int32_t>()[j] + i);
    }
  }
  Tensor dst = Tensor::Zeros({4, 2, 3}, DType::kF32);
  ASSERT_TRUE(ScatterRows(got, index, &dst).ok());
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(dst.data<float>()[r * 6 + i], r == 1 ? 0.0f : 100.0f * r + i) << r << " " << i;
    }
  }
}

TEST(RowsTest, RowsOfAnyDtype) {
  Tensor src = Tensor::FromVector<int32_t>({3, 1}, {7, 8, 9});
  Tensor got;
  ASSERT_TRUE(GatherRows(src, Tensor::FromVector<int32_t>({2}, {2, 2}), &got).ok());
  EXPECT_EQ(got.data<int32_t>()[0], 9);
  EXPECT_EQ(got.data<int32_t>()[1], 9);
}

TEST(RowsTest, CopyColumnsWritesOneBlock) {
  Tensor src = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor dst = Tensor::Zeros({2, 4}, DType::kF32);
  ASSERT_TRUE(CopyColumns(src, 1, 2, &dst, 2).ok());
  const std::vector<float> want = {0, 0, 2, 3, 0, 0, 5, 6};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(dst.data<float>()[i], want[i]) << i;
}

TEST(RowsTest, BadArgumentsAreOneClearError) {
  Tensor src = Tensor::Zeros({3, 2}, DType::kF32);
  Tensor got;
  Status s = GatherRows(src, Tensor::FromVector<int32_t>({1}, {3}), &got);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("index[0] = 3, expected [0, 3)"), std::string::npos) << s.message();
  Tensor wrong = Tensor::Zeros({3, 3}, DType::kF32);
  EXPECT_EQ(ScatterRows(src, Tensor::FromVector<int32_t>({3}, {0, 1, 2}), &wrong).code(),
            StatusCode::kInvalidArgument);
  Tensor dst = Tensor::Zeros({3, 2}, DType::kF32);
  s = CopyColumns(src, 1, 2, &dst, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace orrery::kernels
