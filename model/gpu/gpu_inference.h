// GpuInferenceState: the decode state of a GpuModel on its device, in slots, and the inference
// calls over it — the device twin of model/inference_state.h with Model::Prefill / DecodeStep.
//
// Per slot (spec §2.3, §3.3):
//   * per KDA layer: the recurrent state S [H, K, V] f32 and the short-conv history (the last
//     conv_size - 1 pre-conv q, k and v rows, compute dtype), stacked over slots ([S, ...]);
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
// the call. Feeds longer than prefill_chunk tokens run as successive chunks. The *AndSample forms
// draw each slot's next token on the device instead (kernels/token_sampling.h: the rule of
// rollout/sampling.h with the caller's uniform numbers) and copy out only the ids, behaviour
// log-probabilities and expert ids.
//
// Prefill is one general pass per chunk: host index arrays of the call (packed segments, conv
// windows, slot mapping, a block table as wide as the call's longest slot) uploaded each time,
// the KDA and conv state gathered and scattered around the pass. DecodeStep takes the fixed-shape
// step instead (options.decode):
//   * the call's n slots are padded to a batch bucket B (1, 2, 3, 4, 6, 8, 12, 16, 24, ...: the
//     powers of two and their 1.5 multiples, up to the bucket of num_slots); the step reads its
//     inputs from device buffers of the state, refreshed by one asynchronous copy per step
//     (tokens; each row's state row, -1 for padding; its row of the block table; its latent slot;
//     its context length; the sampling parameters) and, when pages changed, the changed rows of a
//     block table kept on the device at the fixed width W = ceil(max_tokens_per_slot /
//     page_size);
//   * the KDA layers run the decode kernel on their rows of the state tables in place
//     (kernels::KdaDecodeStep with rows and the fused input transforms, kernels::
//     ShortConvSiluDecode), the MLA layers the absorbed path (per-head products as one
//     strided-batched matmul) over the call's rows of the block table;
//   * padding rows compute from a zero KDA state and write nothing; their attention reads one
//     row of page 0 (the pools are zeroed at creation) and writes no latent;
//   * decode = kGraph: the step of bucket B is captured as a CUDA graph (core/cuda_graph.h) the
//     second time B is used (the first runs eagerly, which also warms every lazy initialisation)
//     and replayed from then on. Memory the capture allocates comes from a private pool of this
//     state's (shared by its graphs, which run one at a time). A graph is never re-captured: all
//     it reads is at fixed addresses (the weights, written in place by LoadWeights /
//     RefreshComputeCopies; the biases' device copies; the state tables, pools, input buffers and
//     the block table at width W) and nothing in it depends on host values that change between
//     steps (the split-KV count of kernels::MlaDecodePaged is a function of B and W; context
//     lengths are read on the device). Graphs need the bf16 path on CUDA (in f32 the MoE
//     experts' per-expert loop reads counts back): otherwise, or when a capture fails, graphs are
//     off for this state and the step runs eagerly, the reason in decode_stats().
//   * decode = kEager runs the same step op by op (the CPU twins run this: graphs and eager give
//     bit-identical results); decode = kPass runs DecodeStep as a Prefill of one token per slot
//     (the general pass, kept to A/B). ORRERY_DECODE=graph|eager|pass overrides the option.
// A step queues its work and waits only for its outputs' copy back (logits, or ids and
// log-probabilities, and the expert ids), with no allocation of host index arrays. Errors found
// before the step (bad slots or tokens, too few pages) change nothing; a failure of the device
// work itself leaves the call's slots' KDA and conv state undefined (reset them): the decode step
// advances the state tables in place.
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
#include <string>
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
  // context over blocks; tests/gpu/gpu_long_context_bench.cc measures where the forms cross:
  // on the H200 (small, 8 heads, docs/benchmarks.md) the MHA form was as fast from 2048 tokens
  // at contexts 0 and 64K (at 64K from 1024 already; 1024 fresh tokens: 24.8 vs 15.6 ms).
  int64_t mha_prefill_min_tokens = 2048;
  // Device bytes the MHA form leaves free beyond its keys and values, for the pass's activations.
  int64_t mha_prefill_reserve_bytes = int64_t{4} << 30;
  enum class Decode { kGraph, kEager, kPass };
  Decode decode = Decode::kGraph;  // see the file comment
};

// How one slot's next token is drawn on the device (rollout/sampling.h's rule; the caller has
// validated temperature >= 0 and top_p in (0, 1], and draws `uniform` in [0, 1) from its stream).
struct TokenDraw {
  double temperature = 1.0;
  double top_p = 1.0;
  float uniform = 0.0f;
};

// The *AndSample calls' results: per slot of the call, its drawn token and the behaviour
// log-probability of it (log softmax(z / T)[id]); the R3 expert ids as StepOutput's.
struct SampledStep {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  Tensor expert_ids;  // i32 [moe_layers, tokens fed, top_k] on the host
};

// What DecodeStep did so far.
struct DecodeStats {
  int64_t graph_replays = 0;  // steps replayed from a captured graph
  int64_t graph_captures = 0;
  int64_t graph_nodes = 0;  // nodes of the graphs captured, summed
  int64_t eager_steps = 0;  // fixed-shape steps run op by op
  int64_t pass_steps = 0;   // steps run as a general pass (decode = kPass)
  std::string graphs_off;   // why graphs were turned off (empty: they were not)
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
  // Pages feeding `tokens` more tokens to allocated `slot` would take from the pool, a copy of a
  // shared, partially filled last page included (0 without MLA layers): what a call checks, so a
  // scheduler can ask first. The needs of distinct slots add up (an upper bound: once one of two
  // slots sharing a page has copied it, the other writes in place).
  int64_t PagesNeeded(int64_t slot, int64_t tokens) const;
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
  // The same, drawing each slot's next token on the device (draws[i] for slots[i]).
  StatusOr<SampledStep> PrefillAndSample(const std::vector<int64_t>& slots,
                                         const std::vector<std::vector<int32_t>>& tokens,
                                         const std::vector<TokenDraw>& draws);
  StatusOr<SampledStep> DecodeAndSample(const std::vector<int64_t>& slots,
                                        const std::vector<int32_t>& tokens,
                                        const std::vector<TokenDraw>& draws);

  const DecodeStats& decode_stats() const;
  // How later DecodeSteps run (graphs captured so far are kept for a switch back): A/B runs of
  // the three paths on one state.
  void set_decode(GpuInferenceOptions::Decode mode);
  // The bucket a decode call of n slots is padded to.
  int64_t DecodeBucket(int64_t n) const;

  struct Impl;

 private:
  explicit GpuInferenceState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orrery::model
