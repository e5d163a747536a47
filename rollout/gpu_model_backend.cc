#include "rollout/gpu_model_backend.h"

#include "core/cuda_ipc.h"
#include "rollout/feed_plan.h"
#include "rollout/model_backend.h"

namespace orrery::rollout {

StatusOr<std::unique_ptr<GpuModelBackend>> GpuModelBackend::Create(
    model::Model& host, const GpuBackendOptions& options) {
  const int64_t max_context =
      options.max_context > 0 ? options.max_context : host.config().max_seq_len;
  if (options.max_slots < 1 || max_context < 2) {
    return InvalidArgumentError("gpu model backend: max_slots must be >= 1 and max_context >= 2");
  }
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<model::GpuModel> gpu,
                          model::GpuModel::FromHost(host, options.model));
  model::GpuInferenceOptions io;
  io.num_slots = options.max_slots;
  io.max_tokens_per_slot = max_context;
  io.page_size = options.page_size;
  io.num_pages = options.num_pages;
  io.decode = options.decode;
  ORRERY_ASSIGN_OR_RETURN(auto state, model::GpuInferenceState::Create(gpu.get(), io));
  for (int s = 0; s < options.max_slots; ++s) {
    ORRERY_ASSIGN_OR_RETURN(int64_t slot, state->Allocate());
    if (slot != s) return InternalError("gpu model backend: slots are not handed out in order");
  }
  return std::unique_ptr<GpuModelBackend>(
      new GpuModelBackend(std::move(gpu), std::move(state), options.max_slots, max_context));
}

GpuModelBackend::GpuModelBackend(std::unique_ptr<model::GpuModel> model,
                                 std::unique_ptr<model::GpuInferenceState> state, int max_slots,
                                 int64_t max_context)
    : model_(std::move(model)),
      state_(std::move(state)),
      max_slots_(max_slots),
      max_context_(max_context) {}

int64_t GpuModelBackend::vocab_size() const { return model_->config().vocab_size; }
int GpuModelBackend::moe_layers() const {
  return static_cast<int>(model_->config().num_moe_layers());
}
int GpuModelBackend::top_k() const { return static_cast<int>(model_->config().moe.top_k); }

void GpuModelBackend::Release(int slot) {
  if (slot >= 0 && slot < max_slots_) (void)state_->Reset(slot);
}

Status GpuModelBackend::CopySlot(int src, int dst) { return state_->CopySlot(src, dst); }

int64_t GpuModelBackend::context_capacity() const {
  return state_->num_pages() * state_->page_size();
}
int64_t GpuModelBackend::free_context() const { return state_->free_pages() * state_->page_size(); }
int64_t GpuModelBackend::FeedCost(int slot, int64_t tokens) const {
  return state_->PagesNeeded(slot, tokens) * state_->page_size();
}

StatusOr<FeedResult> GpuModelBackend::Feed(const std::vector<int>& slots,
                                           const std::vector<std::vector<int32_t>>& tokens) {
  ORRERY_ASSIGN_OR_RETURN(FeedPlan plan,
                          FeedPlan::Make(slots, tokens, max_slots_, max_context_, vocab_size(),
                                         [this](int s) { return state_->length(s); }));
  model::StepOutput pre, dec;
  if (!plan.prefill_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(pre, state_->Prefill(plan.prefill_slots, plan.prefill_tokens));
  }
  if (!plan.decode_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(dec, state_->DecodeStep(plan.decode_slots, plan.decode_tokens));
  }
  return plan.Merge(pre, dec, vocab_size(), moe_layers(), top_k());
}

StatusOr<SampledFeed> GpuModelBackend::FeedAndSample(
    const std::vector<int>& slots, const std::vector<std::vector<int32_t>>& tokens,
    const std::vector<SlotDraw>& draws) {
  if (draws.size() != slots.size()) {
    return InvalidArgumentError("gpu model backend: " + std::to_string(slots.size()) +
                                " slots but " + std::to_string(draws.size()) + " draws");
  }
  for (const SlotDraw& d : draws) ORRERY_RETURN_IF_ERROR(ValidateSamplingOptions(d.options));
  ORRERY_ASSIGN_OR_RETURN(FeedPlan plan,
                          FeedPlan::Make(slots, tokens, max_slots_, max_context_, vocab_size(),
                                         [this](int s) { return state_->length(s); }));
  // The draws of each call, in its row order (FeedPlan keeps the feed's order within a call).
  std::vector<model::TokenDraw> pre_draws, dec_draws;
  for (size_t i = 0; i < slots.size(); ++i) {
    const bool decode = tokens[i].size() == 1 && state_->length(slots[i]) > 0;
    const model::TokenDraw d{draws[i].options.temperature, draws[i].options.top_p,
                             draws[i].uniform};
    (decode ? dec_draws : pre_draws).push_back(d);
  }
  if (pre_draws.size() != plan.prefill_slots.size() ||
      dec_draws.size() != plan.decode_slots.size()) {
    return InternalError("gpu model backend: the draws do not follow the feed plan");
  }
  FeedPlan::SampledCall pre, dec;
  if (!plan.prefill_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(
        model::SampledStep s,
        state_->PrefillAndSample(plan.prefill_slots, plan.prefill_tokens, pre_draws));
    pre = {std::move(s.ids), std::move(s.logprobs), s.expert_ids};
  }
  if (!plan.decode_slots.empty()) {
    ORRERY_ASSIGN_OR_RETURN(
        model::SampledStep s,
        state_->DecodeAndSample(plan.decode_slots, plan.decode_tokens, dec_draws));
    dec = {std::move(s.ids), std::move(s.logprobs), s.expert_ids};
  }
  return plan.MergeSampled(pre, dec, moe_layers(), top_k());
}

Status GpuModelBackend::LoadWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                                    int64_t version) {
  // Every parameter (its fp32 master) and balancing bias by name, checked before any is written.
  ORRERY_RETURN_IF_ERROR(CopyNamedTensors(model_->NamedMasters(), named));
  return WeightsWritten(version);
}

StatusOr<std::vector<std::pair<std::string, Tensor>>> GpuModelBackend::WeightTargets() {
  return model_->NamedMasters();
}

Status GpuModelBackend::WeightsWritten(int64_t version) {
  ORRERY_RETURN_IF_ERROR(model_->RefreshComputeCopies());
  // Applied when this returns (the casts are queued ahead of the next step's kernels anyway): a
  // caller that times the apply times the work, not its queueing.
  if (model_->device().is_cuda())
    ORRERY_RETURN_IF_ERROR(CudaDeviceSynchronize(model_->device().index));
  version_ = version;
  return Status::OK();
}

}  // namespace orrery::rollout
