// Internal to model/gpu: the layers of the GPU model (model/gpu/gpu_model.h), each an explicit
// forward and backward over the Tensor-level ops of kernels/*.h, mirroring model/layers.h (the
// host oracle) step for step so that the two can be compared op by op.
//
// Dtypes: activations in the compute dtype (bf16, or f32 in the debug mode); weights as an fp32
// master with its fp32 gradient and a compute copy; parameter gradients and the gradients that
// flow into sums (layer inputs, the residual stream) accumulated in fp32. A backward takes its
// upstream gradient in the compute dtype and adds its input gradient into an fp32 tensor.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"
#include "kernels/moe.h"
#include "kernels/situ.h"
#include "model/config.h"

namespace orrery::model::gpu {

// One parameter on the device: fp32 master and gradient and the compute copy (the master itself
// in the f32 mode). Views share storage (stacked experts, row slices of a projection).
struct Weight {
  Tensor master, grad, compute;
  // Rows [begin, end) of a 2-D weight, as a weight of its own (views of all three tensors).
  StatusOr<Weight> Rows(int64_t begin, int64_t end) const;
};

// The device weights by checkpoint name ("layers.3.kda.wq"), built by GpuModel from the host model.
class WeightTable {
 public:
  void Put(const std::string& name, Weight w) { weights_[name] = std::move(w); }
  StatusOr<Weight> Get(const std::string& name) const;
  bool Has(const std::string& name) const { return weights_.count(name) > 0; }

 private:
  std::unordered_map<std::string, Weight> weights_;
};

// The packed batch's document structure, in the forms the ops take.
struct Sequences {
  int64_t n = 0;     // tokens
  Tensor cu_host;    // i64 [docs + 1] on the CPU (the KDA op)
  Tensor cu_device;  // the same on the device (conv, attention)
};

// ---- inference over slots (model/gpu/gpu_inference.h) ----
// The new tokens of one inference call: one segment per slot, in call order, packed to n rows.
struct InferenceSegments {
  int64_t n = 0;
  std::vector<int64_t> cu;  // [segments + 1] offsets
  Tensor cu_host;           // the same, i64 on the CPU (the KDA op takes it there)
  Tensor cu_device;         // and on the device
  // The short conv over each segment's window [its conv_size - 1 history rows ; its new rows]:
  // the windows are packed as "ext" rows, gathered from [all histories ; all new rows]. Built once
  // per call and shared by every KDA layer. With conv_size 1 there is no history (all undefined).
  Tensor ext_index;    // i32 [segments * hist + n]: for each ext row, its row in [histories ; new]
  Tensor ext_cu;       // i64 [segments + 1] on the device: the windows' offsets in ext
  Tensor ext_cu_host;  // the same on the CPU (the short conv checks it there)
  Tensor new_rows;     // i32 [n]: the ext rows of the new tokens
  Tensor hist_rows;    // i32 [segments * hist]: the ext rows that become each segment's history
};

// One KDA layer's state for the slots of a call, gathered in call order; Infer advances it.
struct KdaSlotState {
  Tensor state;    // f32 [segments, H, K, V]
  Tensor conv[3];  // compute dtype [segments * (conv_size - 1), width]: q, k, v pre-conv rows
};

// One KDA layer's state tables for a decode step (GpuKda::Decode): each token's slot is a row of
// the tables, read and written in place (no gather and scatter).
struct KdaStateRows {
  Tensor rows;              // i32 [n] on the device: token i's row of the tables
  Tensor* state = nullptr;  // f32 [S, H, K, V]
  Tensor* conv[3] = {};     // compute dtype [S, conv_size - 1, width] (undefined with conv_size 1)
};

// The call's view of the MLA layers' paged latent caches (the same pages in every MLA layer;
// only the pool tensor differs), in kernels/mla_decode.h's terms.
struct MlaPagedCall {
  Tensor slot_mapping;  // i32 [n]: page * page_size + offset of each new token
  Tensor block_table;   // i32 [segments, max_pages]
  Tensor context_lens;  // i32 [segments]: tokens of each slot after this call
  // Every segment has the same length (decode: 1): one attention call over all of them;
  // otherwise one call per segment.
  bool uniform = false;
};

// The MHA-form prefill of a call (GpuMla::InferMha; GpuInferenceState chooses it for long feeds,
// model/gpu/gpu_inference.h). Each slot of the call owns a run of rows in every MLA layer's
// MlaContextKv: row begin + p holds the keys and values of the slot's position p, its context
// decompressed once per Prefill call and each pass's new tokens appended. A segment's queries are
// the last positions of its keys.
struct MlaMhaCall {
  Tensor rows;                 // i32 [n]: the row of each new token (its keys and values go there)
  std::vector<int64_t> begin;  // per segment: the row of its slot's position 0
  std::vector<int64_t> keys;   // per segment: its slot's tokens after this pass
  // Per segment, on the device: i64 {0, new tokens} and {0, keys} (PrefixCausalAttention).
  std::vector<Tensor> cu_q, cu_k;
};
// One MLA layer's keys and values of the slots of an MHA-form call, in the compute dtype:
// k [rows, H, dn + dr], v [rows, H, dv].
struct MlaContextKv {
  Tensor k, v;
};

// One forward of the stack over an inference call's new tokens (GpuModel::RunInference). The
// sequence mixers, which read and write the slots' state, are the caller's. A decode step captured
// into a CUDA graph (model/gpu/gpu_inference.h) runs this too: everything it does is queued on
// the device's stream, with no read back and no host copy (the balancing biases are device
// copies refreshed by GpuModel::SyncInferenceInputs before the pass).
class GpuKda;
class GpuMla;
using InferenceMixer = std::function<Status(int64_t layer, const GpuKda* kda, const GpuMla* mla,
                                            const Tensor& x, Tensor* y)>;
struct InferencePass {
  Tensor tokens;  // i32 [n] on the device (checked by the caller: the embedding does not)
  // i32 [segments] on the device: the rows whose next-token logits to return; undefined: every
  // row (a decode step, one row per segment).
  Tensor last;
  InferenceMixer mixer;  // layer l's mixer on its normalised input x [n, d]: *y [n, d]
  Tensor logits;         // out: f32 [segments, vocab] on the device
  // out: per MoE layer, i32 [n, top_k] on the device; when `expert_ids_out` is defined (i32
  // [moe_layers, n, top_k] on the device) the routing writes its slices instead, and these are
  // views of it.
  std::vector<Tensor> expert_ids;
  Tensor expert_ids_out;
};

// ---- helpers over kernels::Matmul and the element-wise ops ----
// y = x W^T (x [n, in] in the compute dtype; y allocated).
Status Linear(const Tensor& x, const Weight& w, Tensor* y);
// W.grad += dy^T x, and when dx is non-null *dx (fp32 [n, in], allocated as zeros when undefined)
// += dy W.
Status LinearGrad(const Tensor& x, const Weight& w, const Tensor& dy, Tensor* dx);
// W.grad += dy^T x and dx = dy W in dy's dtype (overwritten; allocated when undefined): the
// upstream gradient of the next backward op in a chain.
Status LinearGradChain(const Tensor& x, const Weight& w, const Tensor& dy, Tensor* dx);
// t in `dtype`: t itself when it already is, else a converted copy.
StatusOr<Tensor> As(const Tensor& t, DType dtype);
// A zero tensor on `device`.
StatusOr<Tensor> ZerosOn(const Shape& shape, DType dtype, Device device);
// *acc (fp32, allocated as zeros like x when undefined) += x.
Status Accumulate(const Tensor& x, Tensor* acc);

// ---- dense gated MLP (SiTU/SiLU-GLU): y = W2 glu(W1 x, W3 x) ----
class GpuMlp {
 public:
  Status Init(const WeightTable& t, const ModelConfig& c, const std::string& prefix);
  struct Cache {
    Tensor x, a, u, h;
  };
  Status Forward(const Tensor& x, Tensor* y, Cache* c) const;
  Status Backward(const Cache& c, const Tensor& dy, Tensor* dx) const;  // *dx (fp32) +=

 private:
  kernels::GluActivation act_;
  Weight w1_, w3_, w2_;
};

// ---- the KDA layer (spec §2.1), the core through kernels::KdaForward with its fused input
// transforms (q/k L2 norm, beta sigmoid, the bounded gate) and keep_for_backward ----
class GpuKda {
 public:
  Status Init(const WeightTable& t, const ModelConfig& c, const std::string& prefix);
  struct Cache {
    Tensor x, qh, kh, vh, qc, kc, v, fa, z, bl, o, on, o_rstd, gate_low, gate, og;
    std::shared_ptr<const kernels::KdaSaved> saved;
  };
  Status Forward(const Tensor& x, const Sequences& s, bool training, Tensor* y, Cache* c) const;
  Status Backward(const Cache& c, const Sequences& s, const Tensor& dy, Tensor* dx) const;
  // Inference: the new tokens x [n, d] of the call's segments continue from `st` (the chunked
  // core from each slot's state, the conv over its history), which is advanced; *y [n, d].
  Status Infer(const Tensor& x, const InferenceSegments& s, KdaSlotState* st, Tensor* y) const;
  // Decode: one new token per row x [n, d], each continuing its row of the state tables: the
  // short conv against the history row (kernels::ShortConvSiluDecode) and the recurrent step
  // with the input transforms applied as it loads (kernels::KdaDecodeStep with rows); *y [n, d].
  Status Decode(const Tensor& x, const KdaStateRows& st, Tensor* y) const;

 private:
  kernels::KdaOptions Options(bool training) const;
  // The per-head output RMSNorm, the sigmoid gate and W_o from c->o [n*H, V]; *y.
  Status Output(const Tensor& x, int64_t n, Cache* c, Tensor* y) const;
  kernels::KdaInputs Inputs(const Cache& c, const Sequences& s) const;
  const ModelConfig* c_ = nullptr;
  int64_t h_ = 0, kd_ = 0, vd_ = 0;
  Weight wq_, wk_, wv_, cq_, ck_, cv_, fa_, fb_, a_log_, dt_bias_, wb_, onorm_, wg_, wo_;
  Weight wga_, wgb_, wgb_bias_;  // output_gate_rank > 0 instead of wg_
};

// ---- gated MLA without positions (spec §3), attention through kernels::CausalAttention ----
class GpuMla {
 public:
  Status Init(const WeightTable& t, const ModelConfig& c, const std::string& prefix);
  struct Cache {
    Tensor x, qa, qan, qa_rstd, q, cl, chat, c_rstd, kv, k, v, o, lse, gl, og;
  };
  Status Forward(const Tensor& x, const Sequences& s, Tensor* y, Cache* c) const;
  Status Backward(const Cache& c, const Sequences& s, const Tensor& dy, Tensor* dx) const;
  // Inference, the absorbed form (host MlaLayer::Infer): the latent rows [c-hat | k^R] of the new
  // tokens x [n, d] are written into `pages` (this layer's pool [num_pages, page_size, dc + dr])
  // at call.slot_mapping, the absorbed queries attend over each slot's pages
  // (kernels::MlaDecodePaged), and W_UV, the gate and W_o follow; *y [n, d].
  Status Infer(const Tensor& x, const InferenceSegments& s, const MlaPagedCall& call, Tensor* pages,
               Tensor* y) const;
  // Inference, the MHA form (the training form's attention, for long prefills): as Infer, the new
  // tokens' latent rows go into `pages` (decode reads them); their keys and values (Decompress)
  // into `kv` at mha.rows; each segment's queries attend to its slot's keys and values in `kv`
  // (kernels::PrefixCausalAttention, the tensor-core kernel for bf16 192/128), W_UV being part of
  // the values. Per (query, key) pair and head 2 (dn + dr) + 2 dv FLOPs (640 at K3's dims)
  // against the absorbed form's 2 (dc + dr) + 2 dc (2176).
  Status InferMha(const Tensor& x, const InferenceSegments& s, const MlaPagedCall& call,
                  const MlaMhaCall& mha, MlaContextKv* kv, Tensor* pages, Tensor* y) const;
  // The per-head keys and values of latent rows [c-hat | k^R] (latents [m, dc + dr], compute
  // dtype): *k [m, H, dn + dr] = [(W_UK c-hat)_h | k^R], *v [m, H, dv] = (W_UV c-hat)_h, as the
  // training forward forms them. Defined k and v (views into an MlaContextKv) are overwritten.
  Status Decompress(const Tensor& latents, Tensor* k, Tensor* v) const;

 private:
  // q [n, H * dqk] from x (through the q LoRA when configured).
  Status Queries(const Tensor& x, Cache* c) const;
  // The queries (c->q), the normalised latent c-hat (c->chat, from c->cl) and the decoupled key
  // k^R (*kr [n, dr]) from x: the start of the training forward and of both inference forms.
  Status Project(const Tensor& x, Cache* c, Tensor* kr) const;
  // The new tokens' queries (c->q) and latent rows [c-hat (normalised) | k^R] (*latents
  // [n, dc + dr]), the rows also written into `pages` at call.slot_mapping: the start of both
  // inference forms.
  Status QueriesAndLatents(const Tensor& x, const MlaPagedCall& call, Tensor* pages, Cache* c,
                           Tensor* latents) const;
  // The sigmoid gate (when configured) and W_o from the attention output o [n, H * dv]; *y.
  Status Output(const Tensor& x, const Tensor& o, Cache* c, Tensor* y) const;
  // The absorbed query qa [n, H * (dc + dr)] = per head [q^N_h W_UK,h | q^R_h] from q [n, H * dqk].
  Status AbsorbQueries(const Tensor& q, Tensor* qa) const;
  // o2 [n, H * dv] = per head ol_h W_UV,h^T from the latent output ol [n, H * dc].
  Status AbsorbOutput(const Tensor& ol, Tensor* o2) const;
  const ModelConfig* c_ = nullptr;
  int64_t h_ = 0, dn_ = 0, dv_ = 0, dqk_ = 0;
  double scale_ = 1;
  Weight wq_, wqa_, qnorm_, wqb_, wc_, wr_, kvnorm_, wkvb_, wg_, wo_;
};

// ---- Stable LatentMoE (spec §5): fp32 router, kernels::RouteTopK, kernels::MoeExperts ----
class GpuMoe {
 public:
  // Stacks the experts' weights [E, F, L] / [E, L, F] on the device and puts per-expert views
  // under their checkpoint names into `t` (call before the generic upload skips them).
  static Status StackExperts(const std::unordered_map<std::string, Tensor>& host,
                             const ModelConfig& c, const std::string& prefix, DType compute,
                             Device device, WeightTable* t, std::vector<Weight>* roots);
  Status Init(const WeightTable& t, const ModelConfig& c, const std::string& prefix);
  struct Cache {
    Tensor x, x32, scores, ids, weights, xl, yl, yl_rstd, yln;
    kernels::MoeExpertsSaved experts;
    GpuMlp::Cache shared;
  };
  // bias f32 [E] on the device; forced i32 [n, k] on the device or undefined.
  Status Forward(const Tensor& x, const Tensor& bias, const Tensor& forced, Tensor* y,
                 Cache* c) const;
  Status Backward(const Cache& c, const Tensor& dy, Tensor* dx) const;

 private:
  const ModelConfig* c_ = nullptr;
  Weight router32_;  // the router with its fp32 master as the compute copy
  Weight down_, up_, lnorm_, w1_, w3_, w2_;
  GpuMlp shared_;
  bool has_shared_ = false;
};

}  // namespace orrery::model::gpu
