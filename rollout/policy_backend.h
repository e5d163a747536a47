// PolicyBackend: what the generation engine needs from a policy — per-slot contexts that grow by
// fed tokens, next-token logits, the experts each fed token was routed to (R3), and weights that
// can be swapped between steps (in-flight updates, so episodes continue across versions).
//
// The contract mirrors the model's inference-state API (Prefill / DecodeStep over slots): Feed
// appends tokens to each listed slot (a prompt, tool results, or the one token just sampled) and
// returns the logits that follow each slot's context; CopySlot gives a slot another's context (a
// group's prompt fed once). For admission control the backend says how much context it can still
// hold (its pool: latent pages on the GPU) and what a feed or a copy would take of it, so the
// caller schedules feeds that fit instead of calls that fail.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "rollout/sampling.h"

namespace orrery::rollout {

struct FeedResult {
  Tensor logits;      // [slots in the call, vocab] f32: next-token logits of each slot
  Tensor expert_ids;  // [moe_layers, tokens fed in the call, top_k] i32, tokens in call order
};

// How one slot's next token is drawn: its options and the uniform number in [0, 1) the caller
// drew from its own stream (the agent loop's per-episode Philox stream), so that a seed
// reproduces an episode whichever side samples.
struct SlotDraw {
  SamplingOptions options;
  float uniform = 0.0f;
};

struct SampledFeed {
  std::vector<SampledToken> tokens;  // per slot of the call: the token drawn and its logprob
  Tensor expert_ids;                 // as FeedResult's
};

class PolicyBackend {
 public:
  virtual ~PolicyBackend() = default;

  virtual int64_t vocab_size() const = 0;
  virtual int moe_layers() const = 0;
  virtual int top_k() const = 0;
  virtual int max_slots() const = 0;
  // Longest context a slot may hold.
  virtual int64_t max_context() const = 0;

  // Appends tokens[i] (non-empty) to slot slots[i] (distinct, in [0, max_slots())).
  virtual StatusOr<FeedResult> Feed(const std::vector<int>& slots,
                                    const std::vector<std::vector<int32_t>>& tokens) = 0;
  // Feed, then one token drawn per slot by draws[i] (rollout/sampling.h: SampleTokenWithUniform's
  // rule). The default feeds and samples the logits on the host; the GPU backend samples on the
  // device and copies out only the ids and log-probabilities (and the expert ids).
  virtual StatusOr<SampledFeed> FeedAndSample(const std::vector<int>& slots,
                                              const std::vector<std::vector<int32_t>>& tokens,
                                              const std::vector<SlotDraw>& draws);
  // Empties a slot.
  virtual void Release(int slot) = 0;
  // Makes slot `dst` hold slot `src`'s context, as if it had been fed the same tokens (dst's own
  // context is dropped): what follows equals feeding dst separately, within the backend's
  // determinism. The GPU backend shares src's pages by reference count (the first divergent write
  // into a shared, partially filled page copies it), the CPU backend copies the state.
  virtual Status CopySlot(int src, int dst) = 0;

  // The pool the slots' contexts are held in, in tokens: `context_capacity()` in all,
  // `free_context()` free now; kUnlimited when nothing but max_context bounds a slot.
  static constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
  virtual int64_t context_capacity() const { return kUnlimited; }
  virtual int64_t free_context() const { return kUnlimited; }
  // What feeding `tokens` more tokens to `slot` would take from the free context (the GPU
  // backend: its new pages, a copy-on-write one included, times the page size), and what
  // CopySlot(src, dst) of an empty dst would take. Costs of feeds to distinct slots add up: a
  // call whose summed cost is at most free_context() does not run out of pool.
  virtual int64_t FeedCost(int /*slot*/, int64_t /*tokens*/) const { return 0; }
  virtual int64_t CopyCost(int /*src*/) const { return 0; }

  // Replaces the weights (every parameter and balancing bias by name, as Model::Save names them)
  // and sets the policy version. Called between Feed calls; contexts are kept.
  virtual Status LoadWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                             int64_t version) = 0;
  virtual int64_t version() const = 0;

  // The tensors LoadWeights writes, by the same names (the backend's own storage, not copies), so
  // a version can be copied straight into them (model/shared_weights.h); then WeightsWritten.
  // Called between Feed calls. Backends that cannot be written in place return Unimplemented.
  virtual StatusOr<std::vector<std::pair<std::string, Tensor>>> WeightTargets() {
    return UnimplementedError("this policy backend takes weights through LoadWeights only");
  }
  // After WeightTargets' tensors were written: what derives from them follows, and the policy
  // version becomes `version`.
  virtual Status WeightsWritten(int64_t version) {
    (void)version;
    return UnimplementedError("this policy backend takes weights through LoadWeights only");
  }
};

}  // namespace orrery::rollout
