// GpuModel: the hybrid model of model/model.h resident on one CUDA device — weights, activations,
// the forward, the backward and the fused LM head + loss — built over the Tensor-level ops of
// kernels/*.h. The host Model stays the oracle: a GpuModel is made from a host model of the same
// config (the same Philox initialisation and parameter names), and whole-model tests compare the
// two under forced routing.
//
// Why not a Model::Impl: Model::Forward returns the [N, V] logits of every token, which the GPU
// path never forms (the loss is fused with the LM head and chunked over tokens), so the training
// entry point here is a loss forward/backward, the shape of learner/trainable_model.h.
//
// Precision (compute_dtype): bf16 activations and weight copies with fp32 accumulation, fp32
// master weights and gradients, an fp32 router; or f32 throughout (the debug mode, which matches
// the host model to rounding: no TF32 anywhere).
//
// Memory: every layer's activations are kept from the forward to the backward, or, with
// GpuModelOptions::recompute_layers, only its inputs (the layer is re-run, with the routing the
// forward chose, just before its backward). Quantile Balancing: the router scores of each MoE layer
// stay on the device, where the thresholds are selected (kernels/moe_balancing.h); only they and
// the routing ids for the loads reach the host, which updates the biases. With several ranks the
// global batch's step runs on host copies of the scores (model/quantile_balancing.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/model.h"

namespace orrery::model {

namespace gpu {
struct InferencePass;
class GpuMla;
}  // namespace gpu

struct GpuModelOptions {
  DType compute_dtype = DType::kBF16;  // kBF16, or kF32 (the debug mode)
  // A CUDA device, or the CPU with kF32: then every op runs its CPU twin, which checks the GPU
  // model's own orchestration (this file's layers, caches and gradient flow) against the host
  // model on a machine without a GPU (tests/unit/model/gpu_model_cpu_test.cc).
  Device device = Device::Cuda(0);
  // Per-layer recomputation: the forward keeps only each layer's inputs (the residual graph's
  // nodes and its MoE routing) and the backward re-runs the layer's forward before its own
  // backward: about one more forward of compute for a peak activation memory of one layer.
  bool recompute_layers = false;
};

// One trainable parameter as the optimizer sees it: fp32 master weights and gradient on the
// device, and the compute copy the forward reads (undefined in the f32 mode, where the master is
// read directly). Expert weights are views into the stacked [E, ...] tensors.
struct GpuParameter {
  std::string name;
  Tensor master, grad, compute;
  bool weight_decay = true;
};

// A packed batch on the host: rows of tokens flattened to n = tokens.size() positions.
struct GpuBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;     // n entries; -1: no loss at this position
  std::vector<int64_t> cu_seqlens;  // document offsets 0 .. n (empty: one document)
  // Optional i32 [num_moe_layers, n, top_k] on the host: routing to replay (R3) instead of the
  // router's top-k; gate weights still come from the current router scores.
  Tensor forced_experts;
};

struct GpuLoss {
  double loss_sum = 0;  // summed token cross-entropy (nats) over positions with a target
  int64_t tokens = 0;   // positions with a target
};

// The loss over the model's final hidden states, for GpuModel::ForwardBackwardWith: the LM head
// is part of it (its weights and gradient are handed in) so a loss can be fused with it and never
// form the [N, V] logits (kernels/lm_head_loss.h, kernels/lm_head_policy_loss.h).
class GpuLossHead {
 public:
  virtual ~GpuLossHead() = default;
  // hn [N, D] in the compute dtype: the final norm's output; head [V, D] the LM head's compute
  // weights. With `backward`, *dhn (undefined on entry) receives d loss / d hn in hn's dtype and
  // *head_grad (f32 [V, D]) accumulates d loss / d head.
  virtual Status Run(const Tensor& hn, const Tensor& head, bool backward, Tensor* dhn,
                     Tensor* head_grad) = 0;
};

struct GpuPassOptions {
  bool backward = false;
  // backward: this pass's router scores join the next UpdateBalancing.
  bool keep_for_balancing = true;
  // Non-null: each MoE layer's router scores f32 [n, E] of this pass, copied to the host (the RL
  // trainer's routing agreement).
  std::vector<Tensor>* router_scores = nullptr;
};

class GpuModel {
 public:
  // Uploads `host` (an f32 Model) to the device. Fails with one line when no CUDA device is
  // visible, when an allocation fails (the bytes asked for), or for a config the GPU path does not
  // implement yet.
  static StatusOr<std::unique_ptr<GpuModel>> FromHost(Model& host, const GpuModelOptions& options);
  ~GpuModel();

  const ModelConfig& config() const;
  DType compute_dtype() const;
  Device device() const;
  // In the host model's order and names.
  std::vector<GpuParameter>& parameters();
  // f32 [E] per MoE layer on the host: selection-only biases, updated by UpdateBalancing.
  std::vector<Tensor>& balancing_biases();
  // Every parameter's fp32 master (device) and every balancing bias (host, named
  // "layers.L.moe.balancing_bias"), by checkpoint name: what a policy version is (views, not
  // copies; after writing the masters directly call RefreshComputeCopies).
  std::vector<std::pair<std::string, Tensor>> NamedMasters();

  // Loss over batch.targets; with `backward`, adds grad_scale * d loss_sum / d theta to every
  // GpuParameter::grad and keeps the router scores for the next UpdateBalancing.
  StatusOr<GpuLoss> ForwardBackward(const GpuBatch& batch, double grad_scale, bool backward);
  // The same forward (and backward) with `head` as the loss: batch.targets are checked but left
  // to the head. Without backward it is a forward-only pass (no activations kept past a layer).
  Status ForwardBackwardWith(const GpuBatch& batch, GpuLossHead* head,
                             const GpuPassOptions& options);
  // One Quantile-Balancing step per MoE layer from the scores kept since the last call.
  // With a group of several ranks, the global batch's step (model/quantile_balancing.h).
  Status UpdateBalancing(BalancingMetrics* metrics, const RankGroup& group = {});
  Status ZeroGrad();
  // Re-derives the compute copies from the masters (after the masters were written directly,
  // e.g. by a checkpoint restore). The optimizer writes them itself (kernels/adamw_op.h).
  Status RefreshComputeCopies();
  // Copies the master weights and the balancing biases into `host` (same config), e.g. to save
  // with Model::Save or to run the host model on the GPU model's weights.
  Status CopyToHost(Model* host) const;

  // Inference, internal to model/gpu (GpuInferenceState, model/gpu/gpu_inference.h): one forward
  // of the stack over the pass's new tokens with its sequence mixers, the balancing biases of the
  // time and no routing forced; fills the pass's logits and expert ids. It queues device work
  // only (no read back, no host copy: a decode step captures it into a CUDA graph), so the
  // inputs it reads from the host side are refreshed before it by SyncInferenceInputs: the
  // balancing biases' device copies (uploaded when their host values changed). Token ids are
  // the caller's to check.
  Status RunInference(gpu::InferencePass* pass);
  // Internal to model/gpu (GpuInferenceState's MHA-form prefill): layer `layer`'s gated MLA, or
  // null for a KDA layer or a layer outside the stack.
  const gpu::GpuMla* mla_layer(int64_t layer) const;
  Status SyncInferenceInputs();

  class Impl;

 private:
  explicit GpuModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace orrery::model
