// GpuInferenceState: the decode state of a GpuModel on its device, in slots, and the inference
// calls over it — the device twin of model/inference_state.h with Model::Prefill / DecodeStep.
//
// Per slot (spec §2.3, §3.3):
//   * per KDA layer: the recurrent state S [H, K, V] f32 and the short-conv history (the last
//     conv_size - 1 pre-conv q, k and v rows, compute dtype), stacked over slots ([S, ...]) so a
//     call gathers the rows of its slots, runs them as one batch and scatters them back;
//   * the MLA latent rows [c-hat | k^R] (dc + dr wide, compute dtype) in fixed-size pages: one
//     pool [num_pages, page_size, dc + dr] per MLA layer, page p meaning the same tokens in every
//     layer's pool, one free list, and per slot a block table (its pages in token order).
// Pages are taken as a slot grows and returned when it is released or reset; when the pool is
// empty the call fails with ResourceExhausted before anything changes (never a silent
// truncation). CopySlot shares the source's pages by reference count (a group's prompt is
// prefilled once); the first write into a shared, partially filled last page copies it first
// (copy-on-write), so full shared pages stay shared for good. The KDA and conv rows are copied.
//
// Prefill appends tokens (a prompt, tool results: a slot holding a prefix continues, multi-turn)
// and DecodeStep one token per slot; both return what Model::Prefill / DecodeStep return (the
// next-token logits, here f32, and the R3 expert ids) for the GpuModel's weights as they are at
// the call. Feeds longer than prefill_chunk tokens run as successive chunks.
//
// Not thread-safe: one owner drives a state. The GpuModel must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"

namespace orrery::model {

struct GpuInferenceOptions {
  int64_t num_slots = 1;  // sequences held at once (>= 1)
  // Most tokens one slot may hold, at most the model's max_seq_len; 0: max_seq_len.
  int64_t max_tokens_per_slot = 0;
  int64_t page_size = 64;  // tokens per latent page (>= 1)
  // Pages in each MLA layer's pool; 0: enough for every slot at max_tokens_per_slot.
  int64_t num_pages = 0;
  // Most tokens of one slot per forward pass (>= 1): longer feeds are split into chunks, which
  // bounds the activations of a long prefill.
  int64_t prefill_chunk = 8192;
};

class GpuInferenceState {
 public:
  // A state for `model` with every slot free and empty; the pools and KDA/conv state are
  // allocated here (an allocation failure names the bytes).
  static StatusOr<std::unique_ptr<GpuInferenceState>> Create(GpuModel* model,
                                                             const GpuInferenceOptions& options);
  ~GpuInferenceState();

  int64_t num_slots() const;
  int64_t num_free() const;
  // A free slot, emptied; ResourceExhausted when every slot is in use.
  StatusOr<int64_t> Allocate();
  // Returns `slot` and its pages. Errors on a free or invalid slot.
  Status Release(int64_t slot);
  // Empties an allocated slot (its pages return to the pool; fresh KDA/conv state).
  Status Reset(int64_t slot);
  // Makes allocated slot `dst` hold `src`'s sequence: pages shared, KDA/conv state copied.
  Status CopySlot(int64_t src, int64_t dst);
  bool in_use(int64_t slot) const;
  int64_t length(int64_t slot) const;  // tokens held (0 when free)
  Status CheckSlot(int64_t slot) const;

  int64_t page_size() const;
  int64_t num_pages() const;
  int64_t free_pages() const;
  // Device bytes of the state: KDA and conv state of every slot and the page pools.
  int64_t bytes() const;

  // As Model::Prefill / DecodeStep (slots allocated and distinct; non-empty feeds in the
  // vocabulary). Logits are f32 on the host; expert ids i32 on the host.
  StatusOr<StepOutput> Prefill(const std::vector<int64_t>& slots,
                               const std::vector<std::vector<int32_t>>& tokens);
  StatusOr<StepOutput> DecodeStep(const std::vector<int64_t>& slots,
                                  const std::vector<int32_t>& tokens);

  struct Impl;

 private:
  explicit GpuInferenceState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orrery::model
