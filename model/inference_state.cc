#include "model/inference_state.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "model/inference_state_impl.h"
#include "model/model.h"

namespace orrery::model {

void InferenceState::Impl::ResetSlot(int64_t slot) {
  for (Tensor& t : kda_state) {
    const int64_t per = t.numel() / num_slots;
    std::memset(static_cast<char*>(t.raw_data()) + slot * per * DTypeSize(t.dtype()), 0,
                static_cast<size_t>(per) * DTypeSize(t.dtype()));
  }
  for (Tensor& t : conv_state) {
    const int64_t per = t.numel() / num_slots;
    std::memset(static_cast<char*>(t.raw_data()) + slot * per * DTypeSize(t.dtype()), 0,
                static_cast<size_t>(per) * DTypeSize(t.dtype()));
  }
  length[static_cast<size_t>(slot)] = 0;
}

void InferenceState::Impl::Reserve(int64_t slot, int64_t tokens) {
  for (auto& per_slot : mla_cache) {
    Tensor& cache = per_slot[static_cast<size_t>(slot)];
    const int64_t capacity = cache.defined() ? cache.dim(0) : 0;
    if (capacity >= tokens) continue;
    const int64_t grown = std::max<int64_t>({tokens, 2 * capacity, 16});
    Tensor bigger = Tensor::Zeros({grown, latent_width}, dtype);
    if (capacity > 0) std::memcpy(bigger.raw_data(), cache.raw_data(), cache.nbytes());
    cache = bigger;
  }
}

InferenceState::InferenceState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InferenceState::~InferenceState() = default;

StatusOr<std::unique_ptr<InferenceState>> InferenceState::Create(const Model& model,
                                                                 const InferenceOptions& options) {
  if (options.num_slots < 1) {
    return InvalidArgumentError("inference state: num_slots must be >= 1, got " +
                                std::to_string(options.num_slots));
  }
  if (options.max_tokens_per_slot < 0) {
    return InvalidArgumentError("inference state: max_tokens_per_slot must be >= 0, got " +
                                std::to_string(options.max_tokens_per_slot));
  }
  const ModelConfig& c = model.config();
  if (options.max_tokens_per_slot > c.max_seq_len) {
    return InvalidArgumentError(
        "inference state: max_tokens_per_slot " + std::to_string(options.max_tokens_per_slot) +
        " exceeds the model's max_seq_len " + std::to_string(c.max_seq_len));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.max_tokens_per_slot == 0) impl->options.max_tokens_per_slot = c.max_seq_len;
  impl->dtype = model.dtype();
  const int64_t s = options.num_slots;
  impl->num_slots = s;
  impl->conv_rows = c.kda.conv_size - 1;
  impl->conv_width = 2 * c.kda_key_width() + c.kda_value_width();
  impl->latent_width = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim;
  impl->used.assign(static_cast<size_t>(s), false);
  impl->length.assign(static_cast<size_t>(s), 0);
  const DType state_dtype = model.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  for (LayerKind kind : c.layers) {
    if (kind == LayerKind::kKda) {
      impl->kda_state.push_back(
          Tensor::Zeros({s, c.kda.heads, c.kda.head_k_dim, c.kda.head_v_dim}, state_dtype));
      impl->conv_state.push_back(
          Tensor::Zeros({s, impl->conv_rows, impl->conv_width}, model.dtype()));
    } else {
      impl->mla_cache.emplace_back(static_cast<size_t>(s));
    }
  }
  return std::unique_ptr<InferenceState>(new InferenceState(std::move(impl)));
}

int64_t InferenceState::num_slots() const { return impl_->num_slots; }

int64_t InferenceState::num_free() const {
  return std::count(impl_->used.begin(), impl_->used.end(), false);
}

StatusOr<int64_t> InferenceState::Allocate() {
  for (int64_t s = 0; s < impl_->num_slots; ++s) {
    if (!impl_->used[static_cast<size_t>(s)]) {
      impl_->used[static_cast<size_t>(s)] = true;
      impl_->ResetSlot(s);
      return s;
    }
  }
  return ResourceExhaustedError("inference state: all " + std::to_string(impl_->num_slots) +
                                " slots are in use");
}

Status InferenceState::CheckSlot(int64_t slot) const {
  if (slot < 0 || slot >= impl_->num_slots) {
    return InvalidArgumentError("inference state: slot " + std::to_string(slot) +
                                " is outside [0, " + std::to_string(impl_->num_slots) + ")");
  }
  if (!impl_->used[static_cast<size_t>(slot)]) {
    return FailedPreconditionError("inference state: slot " + std::to_string(slot) +
                                   " is not allocated");
  }
  return Status::OK();
}

Status InferenceState::Release(int64_t slot) {
  ORRERY_RETURN_IF_ERROR(CheckSlot(slot));
  impl_->used[static_cast<size_t>(slot)] = false;
  impl_->length[static_cast<size_t>(slot)] = 0;
  return Status::OK();
}

Status InferenceState::Reset(int64_t slot) {
  ORRERY_RETURN_IF_ERROR(CheckSlot(slot));
  impl_->ResetSlot(slot);
  return Status::OK();
}

Status InferenceState::CopySlot(int64_t src, int64_t dst) {
  ORRERY_RETURN_IF_ERROR(CheckSlot(src));
  ORRERY_RETURN_IF_ERROR(CheckSlot(dst));
  if (src == dst) return Status::OK();
  auto copy_row = [&](Tensor& t) {
    const size_t per = static_cast<size_t>(t.numel() / impl_->num_slots) * DTypeSize(t.dtype());
    char* base = static_cast<char*>(t.raw_data());
    std::memcpy(base + dst * per, base + src * per, per);
  };
  for (Tensor& t : impl_->kda_state) copy_row(t);
  for (Tensor& t : impl_->conv_state) copy_row(t);
  const int64_t len = impl_->length[static_cast<size_t>(src)];
  impl_->Reserve(dst, len);
  for (auto& per_slot : impl_->mla_cache) {
    const Tensor& from = per_slot[static_cast<size_t>(src)];
    if (len > 0) {
      std::memcpy(per_slot[static_cast<size_t>(dst)].raw_data(), from.raw_data(),
                  static_cast<size_t>(len * impl_->latent_width) * DTypeSize(impl_->dtype));
    }
  }
  impl_->length[static_cast<size_t>(dst)] = len;
  return Status::OK();
}

bool InferenceState::in_use(int64_t slot) const {
  return slot >= 0 && slot < impl_->num_slots && impl_->used[static_cast<size_t>(slot)];
}

int64_t InferenceState::length(int64_t slot) const {
  if (slot < 0 || slot >= impl_->num_slots) return 0;
  return impl_->length[static_cast<size_t>(slot)];
}

int64_t InferenceState::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : impl_->kda_state) total += static_cast<int64_t>(t.nbytes());
  for (const Tensor& t : impl_->conv_state) total += static_cast<int64_t>(t.nbytes());
  for (const auto& per_slot : impl_->mla_cache) {
    for (const Tensor& t : per_slot) {
      if (t.defined()) total += static_cast<int64_t>(t.nbytes());
    }
  }
  return total;
}

}  // namespace orrery::model
