// SideStream (core/cuda_side_stream.h) on CUDA: the body's work goes to a second stream with its
// own kernel context, ordered after the work queued before Run and before the work queued after
// Join; blocks freed by the body stay out of the caching allocator until Join; where no overlap is
// possible (a graph capture, ORRERY_SIDE_STREAM=0, a nested Run) the body runs on the device's
// stream; a phase scope in the body times the side stream. The whole model's steps with and without
// it are compared bit for bit in tests/gpu/gpu_determinism_test.cc. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "core/cuda_allocator.h"
#include "core/cuda_graph.h"
#include "core/cuda_side_stream.h"
#include "core/device.h"
#include "kernels/cuda/device_context.h"
#include "kernels/gates.h"
#include "kernels/phase_profile.h"
#include "tests/gpu/gpu_test_util.h"

namespace orrery {
namespace {

using kernels::cuda::DeviceContext;

constexpr int64_t kRows = 4096, kCols = 1024;  // 16 MiB of f32: the kernels take a while

Tensor Filled(float value) {
  return Tensor::FromVector<float>({kRows, kCols}, std::vector<float>(kRows * kCols, value))
      .To(Device::Cuda(0))
      .value();
}

TEST(SideStreamGpuTest, TheBodyRunsOnTheSideStreamBetweenTheWorkBeforeAndAfter) {
  SKIP_WITHOUT_GPU();
  const CUstream_st* main_stream = CudaStream(0).value();
  const DeviceContext* main_ctx = DeviceContext::Get(0).value();
  Tensor x = Filled(1.0f);
  Tensor y = Filled(0.0f);
  // Queued before Run on the device's stream: x becomes 3 only there.
  ASSERT_TRUE(kernels::AddInto(Filled(2.0f), 1.0f, &x).ok());
  SideStream side;
  const CUstream_st* body_stream = nullptr;
  const DeviceContext* body_ctx = nullptr;
  ASSERT_TRUE(side.Run(Device::Cuda(0),
                       [&]() -> Status {
                         EXPECT_TRUE(InSideStream(0));
                         body_stream = CudaStream(0).value();
                         body_ctx = DeviceContext::Get(0).value();
                         for (int i = 0; i < 20; ++i) {
                           ORRERY_RETURN_IF_ERROR(kernels::AddInto(x, 1.0f, &y));  // y = 60
                         }
                         return Status::OK();
                       })
                  .ok());
  EXPECT_TRUE(side.overlapped());
  EXPECT_FALSE(InSideStream(0));
  EXPECT_NE(body_stream, main_stream);
  EXPECT_EQ(CudaStream(0).value(), main_stream);
  ASSERT_NE(body_ctx, nullptr);
  EXPECT_NE(body_ctx, main_ctx);
  EXPECT_EQ(body_ctx->stream(), body_stream);
  EXPECT_NE(body_ctx->workspace(), main_ctx->workspace());
  EXPECT_EQ(DeviceContext::Get(0).value(), main_ctx);
  ASSERT_TRUE(side.Join().ok());
  // Queued after Join on the device's stream: it sees the body's y.
  ASSERT_TRUE(kernels::AddInto(y, 1.0f, &y).ok());  // 120
  const Tensor host = y.To(Device::Cpu()).value();
  const float* v = host.data<float>();
  for (int64_t i = 0; i < host.numel(); i += 4099) ASSERT_EQ(v[i], 120.0f) << "element " << i;
}

TEST(SideStreamGpuTest, BlocksFreedByTheBodyReturnToTheCacheOnlyAtJoin) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBytes = size_t{8} << 20;
  ASSERT_TRUE(CudaSynchronize(0).ok());
  ReleaseCachedDeviceMemory(0);
  SideStream side;
  void* freed_in_body = nullptr;
  ASSERT_TRUE(side.Run(Device::Cuda(0),
                       [&]() -> Status {
                         ORRERY_ASSIGN_OR_RETURN(freed_in_body, CudaCachingAlloc(0, kBytes));
                         CudaCachingFree(0, freed_in_body, kBytes);
                         return Status::OK();
                       })
                  .ok());
  ASSERT_TRUE(side.overlapped());
  // Before Join, the device's stream's work cannot be handed that block.
  void* before_join = CudaCachingAlloc(0, kBytes).value();
  EXPECT_NE(before_join, freed_in_body);
  ASSERT_TRUE(side.Join().ok());
  void* after_join = CudaCachingAlloc(0, kBytes).value();
  EXPECT_EQ(after_join, freed_in_body);
  CudaCachingFree(0, before_join, kBytes);
  CudaCachingFree(0, after_join, kBytes);
}

TEST(SideStreamGpuTest, AFailingBodyIsReportedAndJoined) {
  SKIP_WITHOUT_GPU();
  SideStream side;
  const Status st = side.Run(Device::Cuda(0), [] { return InvalidArgumentError("body failed"); });
  EXPECT_EQ(st.ToString(), InvalidArgumentError("body failed").ToString());
  EXPECT_FALSE(InSideStream(0));
  EXPECT_TRUE(side.Join().ok());
}

TEST(SideStreamGpuTest, NoOverlapWhenDisabledNestedOrCaptured) {
  SKIP_WITHOUT_GPU();
  const CUstream_st* main_stream = CudaStream(0).value();
  auto on_main = [&]() -> Status {
    EXPECT_EQ(CudaStream(0).value(), main_stream);
    return Status::OK();
  };
  ASSERT_EQ(setenv("ORRERY_SIDE_STREAM", "0", 1), 0);
  SideStream disabled;
  EXPECT_TRUE(disabled.Run(Device::Cuda(0), on_main).ok());
  EXPECT_FALSE(disabled.overlapped());
  ASSERT_EQ(setenv("ORRERY_SIDE_STREAM", "yes", 1), 0);
  SideStream bad;
  const Status st = bad.Run(Device::Cuda(0), on_main);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ORRERY_SIDE_STREAM='yes'"), std::string::npos) << st.ToString();
  unsetenv("ORRERY_SIDE_STREAM");

  SideStream outer, inner;
  ASSERT_TRUE(outer
                  .Run(Device::Cuda(0),
                       [&]() -> Status {
                         const CUstream_st* side_stream = CudaStream(0).value();
                         ORRERY_RETURN_IF_ERROR(inner.Run(Device::Cuda(0), [&]() -> Status {
                           EXPECT_EQ(CudaStream(0).value(), side_stream);
                           return Status::OK();
                         }));
                         EXPECT_FALSE(inner.overlapped());
                         return Status::OK();
                       })
                  .ok());
  EXPECT_TRUE(outer.overlapped());
  ASSERT_TRUE(outer.Join().ok());

  // Inside a graph capture the body is captured on the device's stream, and the graph replays.
  Tensor y = Filled(0.0f);
  const Tensor one = Filled(1.0f);
  const uint64_t pool = CudaCreatePrivatePool(0).value();
  auto graph = DeviceGraph::Capture(0, pool, [&]() -> Status {
    SideStream captured;
    ORRERY_RETURN_IF_ERROR(captured.Run(Device::Cuda(0), [&]() -> Status {
      EXPECT_EQ(CudaStream(0).value(), main_stream);
      return kernels::AddInto(one, 1.0f, &y);
    }));
    EXPECT_FALSE(captured.overlapped());
    return captured.Join();
  });
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  ASSERT_TRUE((*graph)->Replay().ok());
  ASSERT_TRUE((*graph)->Replay().ok());
  const Tensor host = y.To(Device::Cpu()).value();
  EXPECT_EQ(host.data<float>()[0], 2.0f);
  graph->reset();
  CudaReleasePrivatePool(0, pool);
}

// A phase scope inside the body times the side stream's work (kernels/phase_profile.h records on
// the calling lane's stream): the same kernels take about as long there as on the device's stream.
// Recorded on the device's stream, the body's scope would time nothing.
TEST(SideStreamGpuTest, APhaseScopeInTheBodyTimesTheSideStream) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Filled(1.0f);
  Tensor y = Filled(0.0f), z = Filled(0.0f);
  auto work = [&](Tensor* out) -> Status {
    for (int i = 0; i < 20; ++i) ORRERY_RETURN_IF_ERROR(kernels::AddInto(x, 1.0f, out));
    return Status::OK();
  };
  ASSERT_TRUE(work(&z).ok());  // warm-up: the kernels are loaded before either scope
  ASSERT_TRUE(kernels::PhaseProfile::Start(Device::Cuda(0)).ok());
  {
    kernels::PhaseScope main_scope("main");
    ASSERT_TRUE(work(&z).ok());
  }
  SideStream side;
  ASSERT_TRUE(side.Run(Device::Cuda(0),
                       [&]() -> Status {
                         kernels::PhaseScope side_scope("side");
                         return work(&y);
                       })
                  .ok());
  EXPECT_TRUE(side.overlapped());
  ASSERT_TRUE(side.Join().ok());
  auto times = kernels::PhaseProfile::Stop();
  ASSERT_TRUE(times.ok()) << times.status().ToString();
  double main_ms = -1, side_ms = -1;  // the ops' own phases ("op.add_into") are listed as well
  for (const kernels::PhaseTime& t : *times) {
    if (t.name == "main") main_ms = t.device_ms;
    if (t.name == "side") side_ms = t.device_ms;
  }
  EXPECT_GT(main_ms, 0.05);  // 20 passes over 16 MiB twice: about 0.3 ms on an H200
  EXPECT_GT(side_ms, 0.5 * main_ms) << "main " << main_ms << " ms, side " << side_ms << " ms";
}

}  // namespace
}  // namespace orrery
