// DeviceGraph: the work a function queues on a device's stream (core/cuda_allocator.h), recorded
// once as a CUDA graph and replayed with one launch — the decode step of the GPU inference engine
// (model/gpu/gpu_inference.h), whose hundreds of small kernels cost more to launch one by one
// than to run.
//
// A graph keeps every address its kernels were given and every value passed by the host at
// capture. So the captured function must take its per-call inputs from device buffers that the
// caller refreshes before each replay (device copies outside the capture), must not read device
// data back, and must not copy between host and device (CudaCopy refuses to while capturing);
// shapes, grid sizes and scalar arguments are fixed per graph. Memory allocated during the
// capture comes from a private pool of the caching allocator (core/block_cache.h) and stays owned
// by it, since the graph writes it again at every replay; blocks freed during the capture join
// the pool too. The capture runs in the relaxed mode (cudaStreamCaptureModeRelaxed: the
// allocator may call cudaMalloc meanwhile); anything that synchronises the stream fails the
// capture, which Capture reports.
//
// CPU-only builds: Capture returns FailedPrecondition.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/status.h"

namespace orrery {

class DeviceGraph {
 public:
  // Runs `body` with device `device_index`'s stream in capture mode and private pool `pool`
  // (CudaCreatePrivatePool) active on this thread, then instantiates the graph. A failure of
  // `body` or of the capture ends the capture, discards it and is returned.
  static StatusOr<std::unique_ptr<DeviceGraph>> Capture(int device_index, uint64_t pool,
                                                        const std::function<Status()>& body);
  ~DeviceGraph();
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  // Queues one replay on the device's stream (the host does not wait).
  Status Replay();
  // Nodes (kernels, copies, memsets) of the graph.
  int64_t nodes() const { return nodes_; }
  // The device whose stream the graph replays on.
  int device_index() const { return device_index_; }

  struct Handles;

 private:
  DeviceGraph(int device_index, std::unique_ptr<Handles> handles, int64_t nodes);
  int device_index_;
  std::unique_ptr<Handles> handles_;
  int64_t nodes_;
};

}  // namespace orrery
