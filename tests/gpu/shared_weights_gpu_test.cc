// Shared weights across two processes on one GPU (issue 26 item 5): the learner side (this
// process) publishes versions from its GpuModel's masters into CUDA IPC buffers; a rollout
// process (this binary again, the child test selected) maps each buffer, copies it into its own
// GpuModel device to device and checks every parameter and balancing bias against the version,
// bit for bit (tests/gpu/shared_weights_check.h). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/shared_weights_check.h"

namespace orrery::model {
namespace {

TEST(SharedWeightsGpuTest, ARolloutProcessCopiesEachVersionBitForBit) {
  SKIP_WITHOUT_GPU();
  shared_check::RunParent(Device::Cuda(0), "SharedWeightsGpuChild.*");
}

TEST(SharedWeightsGpuChild, CopiesTheVersionItIsHanded) {
  const char* control = std::getenv(shared_check::kChildVariable);
  if (control == nullptr) GTEST_SKIP() << "the child of SharedWeightsGpuTest (run by it)";
  shared_check::RunChild(control, Device::Cuda(0));
}

}  // namespace
}  // namespace orrery::model
