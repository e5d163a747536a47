// The embedding ops' CPU twin (kernels/embedding.h): gather, scatter-add with repeated ids, and
// out-of-range ids as one clear error. The CUDA kernels are checked against it on a GPU
// (tests/gpu/ops_gpu_test.cc).
#include "kernels/embedding.h"

#include <gtest/gtest.h>

namespace orrery::kernels {
namespace {

TEST(EmbeddingTest, GatherAndScatterAdd) {
  const Tensor table = Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 6});
  const Tensor ids = Tensor::FromVector<int32_t>({4}, {2, 0, 2, 1});
  Tensor y;
  ASSERT_TRUE(EmbeddingGather(table, ids, &y).ok());
  EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + 8),
            (std::vector<float>{5, 6, 1, 2, 5, 6, 3, 4}));
  const Tensor dy = Tensor::FromVector<float>({4, 2}, {1, 1, 2, 2, 10, 10, 3, 3});
  Tensor dtable = Tensor::Zeros({3, 2}, DType::kF32);
  ASSERT_TRUE(EmbeddingScatterAdd(ids, dy, &dtable).ok());
  EXPECT_EQ(std::vector<float>(dtable.data<float>(), dtable.data<float>() + 6),
            (std::vector<float>{2, 2, 3, 3, 11, 11}));
}

TEST(EmbeddingTest, OutOfRangeIdIsOneClearError) {
  const Tensor table = Tensor::Zeros({3, 2}, DType::kF32);
  Tensor y;
  Status st = EmbeddingGather(table, Tensor::FromVector<int32_t>({2}, {0, -1}), &y);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "embedding: ids[1] = -1, expected [0, 3)");
  Tensor dtable = Tensor::Zeros({3, 2}, DType::kF32);
  st = EmbeddingScatterAdd(Tensor::FromVector<int32_t>({1}, {3}),
                           Tensor::Zeros({1, 2}, DType::kF32), &dtable);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "embedding_backward: ids[0] = 3, expected [0, 3)");
  // Nothing was added before the error.
  for (int i = 0; i < 6; ++i) EXPECT_EQ(dtable.data<float>()[i], 0.0f);
}

}  // namespace
}  // namespace orrery::kernels
