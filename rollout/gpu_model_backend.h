// GpuModelBackend: a PolicyBackend over model::GpuModel and its device decode state
// (model/gpu/gpu_inference.h: KDA and conv state per slot, the MLA latent cache in pages). Like
// ModelBackend, multi-token feeds go through one Prefill call and single tokens through one
// batched DecodeStep call, each the GPU twin of the host model's.
//
// LoadWeights writes the GpuModel's fp32 masters and balancing biases in place and refreshes its
// compute copies; every slot's cache is kept (partial rollouts, as with ModelBackend).
//
// The context pool is the state's latent pages: context_capacity() = num_pages x page_size,
// free_context() the free pages x page_size, FeedCost the pages a feed takes
// (GpuInferenceState::PagesNeeded) x page_size. CopySlot shares the source's pages (CopyCost 0)
// and copies its KDA and conv rows.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/gpu/gpu_inference.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"
#include "rollout/policy_backend.h"

namespace orrery::rollout {

struct GpuBackendOptions {
  model::GpuModelOptions model;  // device and compute dtype
  int max_slots = 1;
  int64_t max_context = 0;  // 0: the model's max_seq_len
  // Latent pages (model::GpuInferenceOptions); 0 pages: enough for every slot at max_context.
  int64_t page_size = 64;
  int64_t num_pages = 0;
  // How decode steps run (model::GpuInferenceOptions::decode: CUDA graphs, eager, or the general
  // pass); ORRERY_DECODE overrides it.
  model::GpuInferenceOptions::Decode decode = model::GpuInferenceOptions::Decode::kGraph;
};

class GpuModelBackend : public PolicyBackend {
 public:
  // Uploads `host` (an f32 model; only read here) to the device. Fails with one line without a
  // CUDA device (model::GpuModel::FromHost) or when the state does not fit.
  static StatusOr<std::unique_ptr<GpuModelBackend>> Create(model::Model& host,
                                                           const GpuBackendOptions& options);

  int64_t vocab_size() const override;
  int moe_layers() const override;
  int top_k() const override;
  int max_slots() const override { return max_slots_; }
  int64_t max_context() const override { return max_context_; }
  StatusOr<FeedResult> Feed(const std::vector<int>& slots,
                            const std::vector<std::vector<int32_t>>& tokens) override;
  // Samples on the device (model::GpuInferenceState's *AndSample): only the drawn ids, their
  // log-probabilities and the expert ids are copied to the host.
  StatusOr<SampledFeed> FeedAndSample(const std::vector<int>& slots,
                                      const std::vector<std::vector<int32_t>>& tokens,
                                      const std::vector<SlotDraw>& draws) override;
  void Release(int slot) override;
  Status CopySlot(int src, int dst) override;
  int64_t context_capacity() const override;
  int64_t free_context() const override;
  int64_t FeedCost(int slot, int64_t tokens) const override;
  Status LoadWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                     int64_t version) override;
  int64_t version() const override { return version_; }
  // The masters and balancing biases (model::GpuModel::NamedMasters); WeightsWritten refreshes
  // the compute copies and waits for them.
  StatusOr<std::vector<std::pair<std::string, Tensor>>> WeightTargets() override;
  Status WeightsWritten(int64_t version) override;

  model::GpuModel& model() { return *model_; }
  model::GpuInferenceState& state() { return *state_; }

 private:
  GpuModelBackend(std::unique_ptr<model::GpuModel> model,
                  std::unique_ptr<model::GpuInferenceState> state, int max_slots,
                  int64_t max_context);

  std::unique_ptr<model::GpuModel> model_;
  std::unique_ptr<model::GpuInferenceState> state_;
  int max_slots_;
  int64_t max_context_;
  int64_t version_ = 0;
};

}  // namespace orrery::rollout
