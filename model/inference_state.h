// InferenceState: the per-sequence decode state of a Model, in slots (continuous batching).
//
// A slot holds everything one sequence needs to continue (spec §2.3, §3.3, §6.4):
//   * per KDA layer: the recurrent state S [H, K, V] (f32; f64 for an f64 model) and the short-conv
//     window, the last conv_size - 1 pre-conv q/k/v projections [conv_size - 1, 2*H*K + H*V];
//   * per MLA layer: the latent cache, one row of kv_lora_rank + qk_rope_head_dim values per token
//     (the normalised latent c-hat and the shared, unrotated key slot k^R: 576 wide for K3), read
//     by the absorbed attention form;
//   * AttnRes adds nothing (it mixes across depth for the current token only).
// Sequences of different lengths join (Allocate + Model::Prefill) and leave (Release) at any
// time; a released slot is reset before it is handed out again. CopySlot duplicates a prefix
// (e.g. one prompt prefilled once, then sampled G times for a group).
//
// Not thread-safe: one owner drives a state and the Model calls that use it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

namespace orrery::model {

class Model;

struct InferenceOptions {
  int64_t num_slots = 1;  // sequences held at once (>= 1)
  // Most tokens one slot may hold (prompt + generated), at most the model's max_seq_len; 0: the
  // model's max_seq_len (the MLA cache grows up to it). Exceeding it is a ResourceExhausted error
  // of the Prefill/DecodeStep call, before any change.
  int64_t max_tokens_per_slot = 0;
};

class InferenceState {
 public:
  // A state for `model` (its config and dtype) with every slot free and empty.
  static StatusOr<std::unique_ptr<InferenceState>> Create(const Model& model,
                                                          const InferenceOptions& options);
  ~InferenceState();

  int64_t num_slots() const;
  int64_t num_free() const;
  // A free slot, reset to the empty sequence; ResourceExhausted when every slot is in use.
  StatusOr<int64_t> Allocate();
  // Returns `slot` to the free list (its contents are dropped). Errors on a free or invalid slot.
  Status Release(int64_t slot);
  // Empties an allocated slot (fresh KDA/conv state, no cached tokens); it stays allocated.
  Status Reset(int64_t slot);
  // Makes allocated slot `dst` an exact copy of allocated slot `src` (same prefix).
  Status CopySlot(int64_t src, int64_t dst);
  bool in_use(int64_t slot) const;
  // Tokens held by `slot` (0 when free or empty).
  int64_t length(int64_t slot) const;
  // Bytes of state currently held by all slots (KDA + conv state, MLA caches at their capacity).
  int64_t bytes() const;

  // Checks that `slot` is a valid, allocated slot.
  Status CheckSlot(int64_t slot) const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  explicit InferenceState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orrery::model
