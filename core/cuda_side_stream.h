// SideStream: device work queued on a second stream of a device, so that it overlaps the work
// queued meanwhile on the device's stream (core/cuda_allocator.h) — the MoE layer's shared expert
// beside its routed experts (model/gpu/gpu_moe.cc).
//
//   SideStream side;
//   ORRERY_RETURN_IF_ERROR(side.Run(x.device(), [&] { return shared.Forward(x, &ys); }));
//   ...queue the routed path on the device's stream...
//   ORRERY_RETURN_IF_ERROR(side.Join());  // the device's stream waits for the side work
//
// Run queues an event on the device's stream and makes the side stream wait for it, so the side
// work starts after everything queued before Run. While `body` runs, every op, copy and zeroing
// this thread queues on that device goes to the side stream: CudaStream answers with it, and the
// kernels' DeviceContext (kernels/cuda/device_context.h) with a second context that has its own
// cuBLASLt handle and workspace. Join queues the device's stream's wait for the side work.
//
// Memory. A block freed while `body` runs is held back from the caching allocator until Join has
// queued that wait, so work queued on the device's stream before Join is never handed memory the
// side work may still use. The caller keeps until Join the tensors the side work reads (made
// before Run) and writes (kept from `body`); the routed path in between must not free them.
//
// Where no overlap is possible, `body` runs on the device's stream, Join has nothing to wait for,
// and the results are the same bits: a device that is not CUDA; the device's stream being
// captured into a graph (the decode step's graphs stay on one stream); a Run inside another's
// body; ORRERY_SIDE_STREAM=0 in the environment (read at every Run: the A/B switch of the
// benchmarks and of the test that compares both; a value other than 0 or 1 fails Run).
//
// Threads: one host thread drives a device at a time (kernels/cuda/device_context.h), and it is
// the thread that calls Run, queues the overlapped work and calls Join. The destructor joins a
// side stream left unjoined (an error path), so no side work stays unordered.
#pragma once

#include <functional>

#include "core/device.h"
#include "core/status.h"

namespace orrery {

class SideStream {
 public:
  SideStream() = default;
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  // Runs `body` with `device`'s work queued on its side stream (or inline, above). A failure of
  // `body` is returned after joining.
  Status Run(Device device, const std::function<Status()>& body);
  // The device's stream waits for the side work queued so far; blocks held back are released.
  // Nothing to do after an inline Run, or a second time.
  Status Join();
  // Whether the last Run queued its body on the side stream.
  bool overlapped() const { return overlapped_; }

 private:
  int device_index_ = -1;  // the device to join, -1 when there is none
  bool overlapped_ = false;
};

// Whether this thread is inside a SideStream body on CUDA device `device_index`.
bool InSideStream(int device_index);

}  // namespace orrery
