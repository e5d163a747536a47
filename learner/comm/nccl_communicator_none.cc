// CreateNcclCommunicator in builds without CUDA or without NCCL.
#include "learner/comm/nccl_communicator.h"

namespace orrery::comm {

bool NcclAvailable() { return false; }

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions&) {
  return UnimplementedError(
      "nccl: this build has no NCCL (configure with -DORRERY_CUDA=ON where libnccl and nccl.h "
      "are under the CUDA toolkit)");
}

}  // namespace orrery::comm
