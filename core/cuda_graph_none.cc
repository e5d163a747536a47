// CPU-only build: no graphs (core/cuda_graph.h).
#include "core/cuda_graph.h"

namespace orrery {

struct DeviceGraph::Handles {};

DeviceGraph::DeviceGraph(int device_index, std::unique_ptr<Handles> handles, int64_t nodes)
    : device_index_(device_index), handles_(std::move(handles)), nodes_(nodes) {}

DeviceGraph::~DeviceGraph() = default;

StatusOr<std::unique_ptr<DeviceGraph>> DeviceGraph::Capture(int, uint64_t,
                                                            const std::function<Status()>&) {
  return FailedPreconditionError("cuda graph: this Orrery was built without CUDA");
}

Status DeviceGraph::Replay() {
  return FailedPreconditionError("cuda graph: this Orrery was built without CUDA");
}

}  // namespace orrery
