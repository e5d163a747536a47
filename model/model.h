// Model: the hybrid K3-style language model on the CPU (spec/model.md §2-§6) with explicit
// forward and backward, Quantile-Balancing bias updates and safetensors checkpoints.
//
// Token layout: a Batch holds B rows of T tokens, flattened to N = B*T positions in row-major
// order; logits, router scores and expert ids are indexed by that flat position.
//
// The model is generic over its parameter dtype: f32 for training and inference, f64 for the
// finite-difference gradient checks (the same code, explicitly instantiated for both).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/global_order_statistics.h"
#include "model/inference_state.h"

namespace orrery::model {

struct Parameter {
  std::string name;  // "layers.3.attn.wq", checkpoint key
  Tensor value;
  Tensor grad;        // same shape and dtype; accumulated by Backward, cleared by ZeroGrad
  bool weight_decay;  // false for norms, biases, gates' scalars, A_log, dt_bias, AttnRes queries
};

struct Batch {
  Tensor tokens;  // [B, T] i32, each in [0, vocab_size)
  // Optional i64 [n_docs + 1] document boundaries over the flattened B*T positions: strictly
  // increasing from 0 to B*T and containing every row start b*T. Each document starts with fresh
  // KDA and conv state, and MLA attends only within it. Undefined: one document per row.
  Tensor cu_seqlens;
  // Optional i32 [num_moe_layers, B*T, top_k] expert ids to route by instead of the router's own
  // top-k (R3: replaying the rollout's routing). Gate weights still come from the current router
  // scores of those experts, so the router is trained.
  Tensor forced_experts;
};

// What Backward needs from a Forward, plus the routing of every MoE layer.
class ForwardCache {
 public:
  ForwardCache();
  ~ForwardCache();
  ForwardCache(ForwardCache&&) noexcept;
  ForwardCache& operator=(ForwardCache&&) noexcept;

  // Per MoE layer (in layer order): chosen expert ids [N, top_k] i32 and the unbiased router
  // scores sigmoid(W_r x) [N, num_experts] f32 (the input of Quantile Balancing).
  const std::vector<Tensor>& expert_ids() const;
  const std::vector<Tensor>& router_scores() const;
  // expert_ids() stacked into [num_moe_layers, N, top_k]: the layout of Batch::forced_experts.
  Tensor StackedExpertIds() const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// Quantile Balancing results for one update (spec §5.4 step 8).
struct BalancingMetrics {
  // Per MoE layer: expert load as a fraction of the target k*m/n under the biases before the
  // update, the max violation max_j load_j - 1 before and after (re-routing the same scores with
  // the new biases), and sum_j |delta b_j|.
  std::vector<std::vector<double>> load;
  std::vector<double> max_violation_before;
  std::vector<double> max_violation_after;
  std::vector<double> bias_change;
  // Mean over tokens of the entropy (nats) of the normalised router scores s / sum(s): ln(E) when
  // a token's scores are all equal, 0 when one expert takes all of it.
  std::vector<double> router_entropy;
};

// Output of Model::Prefill and Model::DecodeStep.
struct StepOutput {
  // [slots in the call, vocab] in the model's dtype: the next-token logits of each slot, i.e. the
  // logits at the last token the call appended to it.
  Tensor logits;
  // [num_moe_layers, tokens appended, top_k] i32: the routed experts of every token the call
  // processed, slots in call order and each slot's tokens in order (the layout of
  // Batch::forced_experts for those tokens, for R3 replay).
  Tensor expert_ids;
};

class Model {
 public:
  // Philox initialisation from `seed`; dtype f32 or f64.
  static StatusOr<std::unique_ptr<Model>> Create(const ModelConfig& config, uint64_t seed,
                                                 DType dtype = DType::kF32);
  ~Model();

  const ModelConfig& config() const;
  DType dtype() const;
  std::vector<Parameter>& parameters();
  const std::vector<Parameter>& parameters() const;
  Parameter* FindParameter(const std::string& name);
  // Quantile-Balancing biases e_score_correction_bias, one f32 [num_experts] per MoE layer: used
  // for expert selection only, never trained by gradients.
  std::vector<Tensor>& balancing_biases();

  // Logits [B*T, vocab] in the model's dtype. `cache` (may be null for inference) receives what
  // Backward needs and the routing.
  StatusOr<Tensor> Forward(const Batch& batch, ForwardCache* cache);
  // Accumulates d loss / d parameter into Parameter::grad given dlogits [B*T, vocab].
  Status Backward(const ForwardCache& cache, const Tensor& dlogits);
  void ZeroGrad();

  // One Quantile-Balancing step per MoE layer from the router scores of every micro-batch of an
  // optimizer step (the form and step size come from config().moe). No-op when balancing = none.
  // With a group of several data-parallel ranks (every rank calls it), the step is the global
  // batch's: the same biases and metrics on every rank (model/quantile_balancing.h).
  Status UpdateBalancingBiases(const std::vector<const ForwardCache*>& caches,
                               BalancingMetrics* metrics, const RankGroup& group = {});

  // Weights and balancing biases ("layers.L.moe.balancing_bias") as safetensors; Load checks
  // every name, shape and dtype against this model.
  Status Save(const std::string& path) const;
  Status Load(const std::string& path);

  // Inference over an InferenceState made for this model (model/inference_state.h); slots must be
  // allocated and distinct within a call. Prefill appends prompts[i] (non-empty) to slots[i] in one
  // parallel pass per layer (KDA: chunked core from the slot's state; MLA: absorbed form over the
  // slot's latent cache), so a slot holding a prefix simply continues (multi-turn). DecodeStep
  // appends one token per slot. Both equal the full Forward of each slot's whole sequence (up to
  // rounding) with the balancing biases of the time, and leave the state unchanged on error.
  StatusOr<StepOutput> Prefill(InferenceState* state, const std::vector<int64_t>& slots,
                               const std::vector<std::vector<int32_t>>& prompts);
  StatusOr<StepOutput> DecodeStep(InferenceState* state, const std::vector<int64_t>& slots,
                                  const std::vector<int32_t>& tokens);

  class Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orrery::model
