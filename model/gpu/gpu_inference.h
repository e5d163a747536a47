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
// MLA attention takes one of two forms per slot and call (the rule): a Prefill feed of at least
// mha_prefill_min_tokens tokens takes the MHA form, when its memory fits, and every other feed
// (decode steps, short turns) the absorbed form over the pages (kernels/mla_decode.h); a call
// with both runs as one call per form (a failure in the second leaves the first's slots fed).
// The MHA form decompresses the slot's cached context from its latent pages once at the start of
// the call into per-head keys [k_nope | k^R] and values (W_kvb, spec §3.1), appends each chunk's
// new keys and values and runs the training form's attention over them
// (kernels::PrefixCausalAttention): 640 FLOPs per (query, key) pair and head against 2176 in the
// absorbed form at K3's dims, on the tensor-core flash-attention kernel, and no per-chunk
// re-decompression (which would cost O(L^2) products over a long prompt). The new tokens'
// latents still go into the pages. Memory, freed when the call returns: per token of the slots'
// contexts and feeds, per MLA layer, H (dn + dr + dv) values in the compute dtype
// (MhaBytesPerToken; `small` in bf16: 8 * 320 * 2 B * 4 layers = 20 KiB, 21 GB at 1M tokens). It
// fits when that leaves mha_prefill_reserve_bytes of the device free (DeviceBytesAvailable;
// always on the CPU twins); otherwise, or when the allocation fails, the call runs absorbed.
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
  // Pages in each MLA layer's pool; 0: enough for every slot at max_tokens_per_slot, on CUDA at
  // most half the device's available memory (the pool is shared by the slots).
  int64_t num_pages = 0;
  // Most tokens of one slot per forward pass (>= 1): longer feeds are split into chunks, which
  // bounds the activations of a long prefill.
  int64_t prefill_chunk = 8192;
  // The MHA-form prefill (the rule above): feeds of at least this many tokens per slot; 0: never
  // (every call absorbed). The MHA kernel runs a block per 64 queries and head over the whole
  // context, so a short feed leaves most of the device idle, where the absorbed kernel splits the
  // context over blocks; tests/gpu/gpu_long_context_bench.cc measures where the forms cross.
  int64_t mha_prefill_min_tokens = 1024;
  // Device bytes the MHA form leaves free beyond its keys and values, for the pass's activations.
  int64_t mha_prefill_reserve_bytes = int64_t{4} << 30;
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
  // The MHA-form prefill's scratch per token of a slot's context and feed (all MLA layers).
  int64_t MhaBytesPerToken() const;
  // Tokens fed in the MHA form so far (the rest ran absorbed): tests and benchmarks check the
  // form they meant to run.
  int64_t mha_prefill_tokens() const;

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
