// Communicator: the collectives learner ranks need for data parallelism, behind one interface
// with a Gloo implementation (CPU, TCP; learner/comm/gloo_communicator.h), an NCCL one (CUDA
// builds; learner/comm/nccl_communicator.h) and a single-rank one.
//
// Every rank must call the same collectives in the same order with the same sizes (the usual
// contract). A collective that cannot complete (a peer died, the timeout passed) returns an
// error instead of hanging or throwing: the learner then exits and the supervisor restarts the
// ranks from the last checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "local", "gloo", "nccl"

  // In-place element-wise sum over ranks.
  virtual Status AllReduceSum(std::span<float> data) = 0;
  virtual Status AllReduceSum(std::span<double> data) = 0;
  // Copies `data` of rank `root` into every rank's `data` (same size everywhere).
  virtual Status Broadcast(std::span<uint8_t> data, int root) = 0;
  virtual Status Barrier() = 0;
};

// The trivial communicator of a single rank: every collective is the identity.
std::unique_ptr<Communicator> MakeLocalCommunicator();

// Averages f32 CPU tensors over ranks in place (gradients): one flattened all-reduce for all of
// them, then a scale by 1 / world_size. Every rank must pass the same shapes in the same order.
Status AllReduceMean(Communicator& comm, const std::vector<Tensor>& tensors);

}  // namespace orrery::comm
