// DeviceGraph on the CUDA runtime's stream capture (core/cuda_graph.h).
#include "core/cuda_graph.h"

#include <cuda_runtime.h>

#include <string>

#include "core/cuda_allocator.h"

namespace orrery {
namespace {

Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  return InternalError(std::string("cuda graph: ") + what + ": " + cudaGetErrorName(err) + ": " +
                       cudaGetErrorString(err));
}

}  // namespace

struct DeviceGraph::Handles {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Handles() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

DeviceGraph::DeviceGraph(int device_index, std::unique_ptr<Handles> handles, int64_t nodes)
    : device_index_(device_index), handles_(std::move(handles)), nodes_(nodes) {}

DeviceGraph::~DeviceGraph() = default;

StatusOr<std::unique_ptr<DeviceGraph>> DeviceGraph::Capture(int device_index, uint64_t pool,
                                                            const std::function<Status()>& body) {
  ORRERY_ASSIGN_OR_RETURN(CUstream_st * stream, CudaStream(device_index));
  ORRERY_RETURN_IF_ERROR(Check(cudaSetDevice(device_index), "cudaSetDevice"));
  ORRERY_RETURN_IF_ERROR(CudaBeginPrivatePool(device_index, pool));
  Status st =
      Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  if (!st.ok()) {
    CudaEndPrivatePool(device_index);
    return st;
  }
  Status body_status = body();
  auto handles = std::make_unique<Handles>();
  Status end = Check(cudaStreamEndCapture(stream, &handles->graph), "cudaStreamEndCapture");
  CudaEndPrivatePool(device_index);
  if (!body_status.ok()) {
    cudaGetLastError();  // an invalidated capture leaves its error behind
    return body_status.WithContext("cuda graph: the captured work failed");
  }
  ORRERY_RETURN_IF_ERROR(end);
  if (handles->graph == nullptr) return InternalError("cuda graph: the capture made no graph");
  size_t nodes = 0;
  ORRERY_RETURN_IF_ERROR(
      Check(cudaGraphGetNodes(handles->graph, nullptr, &nodes), "cudaGraphGetNodes"));
  ORRERY_RETURN_IF_ERROR(
      Check(cudaGraphInstantiate(&handles->exec, handles->graph, 0), "cudaGraphInstantiate"));
  return std::unique_ptr<DeviceGraph>(
      new DeviceGraph(device_index, std::move(handles), static_cast<int64_t>(nodes)));
}

Status DeviceGraph::Replay() {
  ORRERY_ASSIGN_OR_RETURN(CUstream_st * stream, CudaStream(device_index_));
  return Check(cudaGraphLaunch(handles_->exec, stream), "cudaGraphLaunch");
}

}  // namespace orrery
