#include "learner/comm/communicator.h"

#include <algorithm>

namespace orrery::comm {
namespace {

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  Status AllReduceSum(std::span<float>) override { return Status::OK(); }
  Status AllReduceSum(std::span<double>) override { return Status::OK(); }
  Status Broadcast(std::span<uint8_t>, int root) override {
    if (root != 0) return InvalidArgumentError("broadcast root " + std::to_string(root) + " of 1");
    return Status::OK();
  }
  Status Barrier() override { return Status::OK(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeLocalCommunicator() {
  return std::make_unique<LocalCommunicator>();
}

Status AllReduceMean(Communicator& comm, const std::vector<Tensor>& tensors) {
  size_t total = 0;
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.dtype() != DType::kF32 || !t.device().is_cpu()) {
      return InvalidArgumentError("all-reduce mean: expected f32 CPU tensors, got " +
                                  (t.defined() ? t.ToString() : std::string("undefined")));
    }
    total += static_cast<size_t>(t.numel());
  }
  if (comm.world_size() == 1) return Status::OK();
  std::vector<float> flat(total);
  size_t at = 0;
  for (const Tensor& t : tensors) {
    std::copy_n(t.data<float>(), t.numel(), flat.data() + at);
    at += static_cast<size_t>(t.numel());
  }
  ORRERY_RETURN_IF_ERROR(comm.AllReduceSum(std::span<float>(flat)));
  const float inv = 1.0f / static_cast<float>(comm.world_size());
  at = 0;
  for (const Tensor& t : tensors) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = flat[at + i] * inv;
    at += static_cast<size_t>(t.numel());
  }
  return Status::OK();
}

}  // namespace orrery::comm
