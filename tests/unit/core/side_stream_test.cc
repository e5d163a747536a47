// SideStream (core/cuda_side_stream.h) where no CUDA device does the work: the body runs inline,
// once, its status returned, nothing to join. The CUDA behaviour is
// tests/gpu/side_stream_gpu_test.cc.
#include <gtest/gtest.h>

#include "core/cuda_side_stream.h"

namespace orrery {
namespace {

TEST(SideStreamTest, OnTheCpuTheBodyRunsInlineOnce) {
  SideStream side;
  int runs = 0;
  ASSERT_TRUE(side.Run(Device::Cpu(),
                       [&] {
                         ++runs;
                         EXPECT_FALSE(InSideStream(0));
                         return Status::OK();
                       })
                  .ok());
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(side.overlapped());
  EXPECT_TRUE(side.Join().ok());
  EXPECT_TRUE(side.Join().ok());
}

TEST(SideStreamTest, TheBodysErrorIsReturned) {
  SideStream side;
  const Status st = side.Run(Device::Cpu(), [] { return InvalidArgumentError("bad body"); });
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "bad body");
  EXPECT_TRUE(side.Join().ok());
}

}  // namespace
}  // namespace orrery
