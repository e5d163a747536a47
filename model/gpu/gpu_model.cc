// The GPU model's stack (spec §4, §6.2), step for step the host ModelImpl::Stack and Backward
// (model/model.cc): embedding, per layer [AttnRes mix -> RMSNorm -> KDA or MLA] and [AttnRes mix
// -> RMSNorm -> dense MLP or LatentMoE], the output mix, the final norm, and the LM head fused with
// the loss (kernels/lm_head_loss.h).
#include "model/gpu/gpu_model.h"

#include <cstring>
#include <string>
#include <unordered_map>

#include "core/device.h"
#include "kernels/attn_res.h"
#include "kernels/embedding.h"
#include "kernels/gates.h"
#include "kernels/lm_head_loss.h"
#include "kernels/matmul.h"
#include "kernels/phase_profile.h"
#include "kernels/rmsnorm.h"
#include "kernels/rows.h"
#include "model/gpu/gpu_layers.h"
#include "model/quantile_balancing.h"

namespace orrery::model {

using gpu::Weight;

namespace {

// A node of the residual graph: an activation [N, D] in the compute dtype and its fp32 gradient.
struct Value {
  Tensor v, g;
};
using ValuePtr = std::shared_ptr<Value>;

struct Mix {
  std::vector<ValuePtr> sources;
  Tensor p;               // [N, n_sources] f32
  bool identity = false;  // no AttnRes: the output is sources.back() itself
};

struct LayerCache {
  bool dropped = false;  // recompute_layers: the sublayers' caches below were released
  Tensor ids;            // MoE layers: the routing of the forward, replayed by a recompute
  Mix attn_mix, mlp_mix;
  ValuePtr p_start, attn_in, a, p_mid, mlp_in, f, p_end;
  Tensor n1, r1, n2, r2;
  gpu::GpuKda::Cache kda;
  gpu::GpuMla::Cache mla;
  gpu::GpuMoe::Cache moe;
  gpu::GpuMlp::Cache mlp;
};

struct Layer {
  Weight attn_res_w, attn_res_g, mlp_res_w, mlp_res_g, norm1, norm2;
  std::unique_ptr<gpu::GpuKda> kda;
  std::unique_ptr<gpu::GpuMla> mla;
  std::unique_ptr<gpu::GpuMoe> moe;
  std::unique_ptr<gpu::GpuMlp> mlp;
};

Status CheckBatch(const GpuBatch& b, const ModelConfig& c) {
  const int64_t n = static_cast<int64_t>(b.tokens.size());
  if (n == 0) return InvalidArgumentError("gpu model: the batch has no tokens");
  if (static_cast<int64_t>(b.targets.size()) != n) {
    return InvalidArgumentError("gpu model: " + std::to_string(b.targets.size()) + " targets for " +
                                std::to_string(n) + " tokens");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= c.vocab_size) {
      return InvalidArgumentError("tokens: id " + std::to_string(b.tokens[i]) + " at position " +
                                  std::to_string(i) + " is outside the vocabulary [0, " +
                                  std::to_string(c.vocab_size) + ")");
    }
    if (b.targets[i] < -1 || b.targets[i] >= c.vocab_size) {
      return InvalidArgumentError("targets: " + std::to_string(b.targets[i]) + " at position " +
                                  std::to_string(i) + " is neither -1 nor in [0, " +
                                  std::to_string(c.vocab_size) + ")");
    }
  }
  const auto& cu = b.cu_seqlens;
  if (!cu.empty()) {
    if (cu.size() < 2 || cu.front() != 0 || cu.back() != n) {
      return InvalidArgumentError("cu_seqlens: must start at 0 and end at " + std::to_string(n));
    }
    for (size_t i = 1; i < cu.size(); ++i) {
      if (cu[i] <= cu[i - 1]) {
        return InvalidArgumentError("cu_seqlens: must be strictly increasing (entry " +
                                    std::to_string(i) + ")");
      }
    }
  }
  if (b.forced_experts.defined()) {
    const Shape want{c.num_moe_layers(), n, c.moe.top_k};
    if (b.forced_experts.dtype() != DType::kI32 || b.forced_experts.shape() != want ||
        !b.forced_experts.device().is_cpu()) {
      return InvalidArgumentError("forced_experts: expected i32 " + ShapeToString(want) +
                                  " on cpu, got " + b.forced_experts.ToString());
    }
  }
  return Status::OK();
}

// The pretraining loss: cross-entropy over batch.targets (-1: no target), fused with the LM head.
class CrossEntropyHead : public GpuLossHead {
 public:
  CrossEntropyHead(const GpuBatch& batch, double grad_scale)
      : batch_(batch), grad_scale_(grad_scale) {}

  Status Run(const Tensor& hn, const Tensor& head, bool backward, Tensor* dhn,
             Tensor* head_grad) override {
    const int64_t n = static_cast<int64_t>(batch_.targets.size());
    std::vector<int32_t> targets(batch_.targets);
    std::vector<float> mask(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      mask[i] = targets[i] >= 0 ? 1.0f : 0.0f;
      loss.tokens += targets[i] >= 0 ? 1 : 0;
      if (targets[i] < 0) targets[i] = 0;
    }
    ORRERY_ASSIGN_OR_RETURN(Tensor targets_dev,
                            Tensor::FromVector<int32_t>({n}, targets).To(hn.device()));
    ORRERY_ASSIGN_OR_RETURN(Tensor mask_dev, Tensor::FromVector<float>({n}, mask).To(hn.device()));
    kernels::LmHeadLossOptions lo;
    lo.grad_scale = grad_scale_;
    return kernels::LmHeadCrossEntropy(hn, head, targets_dev, mask_dev, lo, &loss.loss_sum,
                                       backward ? dhn : nullptr, backward ? head_grad : nullptr);
  }

  GpuLoss loss;

 private:
  const GpuBatch& batch_;
  double grad_scale_;
};

}  // namespace

class GpuModel::Impl {
 public:
  ModelConfig config;
  GpuModelOptions options;
  Device device;
  std::vector<GpuParameter> params;
  std::vector<Weight> roots;  // the tensors that own storage (compute copies refreshed from them)
  gpu::WeightTable table;
  std::vector<Tensor> biases;
  // Inference's device copies of the biases and the host values they hold (SyncInferenceInputs).
  std::vector<Tensor> bias_device, bias_uploaded;
  std::vector<std::vector<Tensor>> kept_scores;  // per MoE layer, per micro-batch: f32, device
  std::vector<Layer> layers;
  Weight embed, out_res_w, out_res_g, final_norm, head;

  Status Build(Model& host) {
    const ModelConfig& c = config;
    const DType cdt = options.compute_dtype;
    std::unordered_map<std::string, Tensor> host_params;
    for (const Parameter& p : host.parameters()) host_params.emplace(p.name, p.value);
    for (int64_t l = c.first_k_dense; l < c.num_layers; ++l) {
      ORRERY_RETURN_IF_ERROR(gpu::GpuMoe::StackExperts(
          host_params, c, "layers." + std::to_string(l) + ".moe", cdt, device, &table, &roots));
    }
    for (const Parameter& p : host.parameters()) {
      if (table.Has(p.name)) continue;  // an expert's view into its stacked tensor
      Weight w;
      ORRERY_ASSIGN_OR_RETURN(w.master, p.value.To(device));
      ORRERY_ASSIGN_OR_RETURN(w.grad, gpu::ZerosOn(p.value.shape(), DType::kF32, device));
      if (cdt == DType::kF32) {
        w.compute = w.master;
      } else {
        ORRERY_ASSIGN_OR_RETURN(w.compute, gpu::As(w.master, cdt));
      }
      table.Put(p.name, w);
      roots.push_back(w);
    }
    for (const Parameter& p : host.parameters()) {
      ORRERY_ASSIGN_OR_RETURN(Weight w, table.Get(p.name));
      params.push_back(GpuParameter{p.name, w.master, w.grad,
                                    cdt == DType::kF32 ? Tensor() : w.compute, p.weight_decay});
    }
    ORRERY_ASSIGN_OR_RETURN(embed, table.Get("embed"));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "layers." + std::to_string(l);
      Layer layer;
      if (c.attn_res_block_size > 0) {
        ORRERY_ASSIGN_OR_RETURN(layer.attn_res_w, table.Get(p + ".attn_res_proj"));
        ORRERY_ASSIGN_OR_RETURN(layer.attn_res_g, table.Get(p + ".attn_res_norm"));
        ORRERY_ASSIGN_OR_RETURN(layer.mlp_res_w, table.Get(p + ".mlp_res_proj"));
        ORRERY_ASSIGN_OR_RETURN(layer.mlp_res_g, table.Get(p + ".mlp_res_norm"));
      }
      ORRERY_ASSIGN_OR_RETURN(layer.norm1, table.Get(p + ".input_norm"));
      ORRERY_ASSIGN_OR_RETURN(layer.norm2, table.Get(p + ".post_attn_norm"));
      if (c.layers[l] == LayerKind::kKda) {
        layer.kda = std::make_unique<gpu::GpuKda>();
        ORRERY_RETURN_IF_ERROR(layer.kda->Init(table, c, p + ".kda"));
      } else {
        layer.mla = std::make_unique<gpu::GpuMla>();
        ORRERY_RETURN_IF_ERROR(layer.mla->Init(table, c, p + ".mla"));
      }
      if (c.is_moe_layer(l)) {
        layer.moe = std::make_unique<gpu::GpuMoe>();
        ORRERY_RETURN_IF_ERROR(layer.moe->Init(table, c, p + ".moe"));
      } else {
        layer.mlp = std::make_unique<gpu::GpuMlp>();
        ORRERY_RETURN_IF_ERROR(layer.mlp->Init(table, c, p + ".mlp"));
      }
      layers.push_back(std::move(layer));
    }
    if (c.attn_res_block_size > 0) {
      ORRERY_ASSIGN_OR_RETURN(out_res_w, table.Get("output_attn_res_proj"));
      ORRERY_ASSIGN_OR_RETURN(out_res_g, table.Get("output_attn_res_norm"));
    }
    ORRERY_ASSIGN_OR_RETURN(final_norm, table.Get("final_norm"));
    ORRERY_ASSIGN_OR_RETURN(head, table.Get("lm_head"));
    for (const Tensor& b : host.balancing_biases()) biases.push_back(b.Clone());
    kept_scores.assign(biases.size(), {});
    return Status::OK();
  }

  static ValuePtr NewValue(Tensor v) {
    auto out = std::make_shared<Value>();
    out->v = std::move(v);
    return out;
  }

  // *g of the node, allocated as fp32 zeros on first use.
  StatusOr<Tensor*> Grad(const ValuePtr& node) {
    if (!node->g.defined()) {
      ORRERY_ASSIGN_OR_RETURN(node->g, gpu::ZerosOn(node->v.shape(), DType::kF32, device));
    }
    return &node->g;
  }

  StatusOr<ValuePtr> Sum(const ValuePtr& a, const ValuePtr& b) {
    Tensor out = a->v.Clone();
    ORRERY_RETURN_IF_ERROR(kernels::AddInto(b->v, 1.0f, &out));
    return NewValue(out);
  }

  StatusOr<ValuePtr> MixForward(const std::vector<ValuePtr>& blocks, const ValuePtr& partial,
                                const Weight& w, const Weight& g, Mix* mix) {
    kernels::PhaseScope scope("fwd.attn_res");
    mix->sources = blocks;
    mix->sources.push_back(partial);
    std::vector<Tensor> src;
    for (const ValuePtr& v : mix->sources) src.push_back(v->v);
    Tensor h;
    ORRERY_RETURN_IF_ERROR(
        kernels::AttnResMix(src, w.compute, g.compute, config.rms_norm_eps, &h, &mix->p));
    return NewValue(h);
  }

  // dout: the gradient of the mix's output in the compute dtype.
  Status MixBackward(const Mix& mix, const ValuePtr& out, const Tensor& dout, const Weight& w,
                     const Weight& g) {
    kernels::PhaseScope scope("bwd.attn_res");
    if (mix.identity) {
      ORRERY_ASSIGN_OR_RETURN(Tensor * og, Grad(out));
      return kernels::AddInto(dout, 1.0f, og);
    }
    std::vector<Tensor> src, dsrc;
    for (const ValuePtr& v : mix.sources) {
      ORRERY_ASSIGN_OR_RETURN(Tensor * vg, Grad(v));
      src.push_back(v->v);
      dsrc.push_back(*vg);
    }
    Tensor dw = w.grad, dg = g.grad;
    return kernels::AttnResMixGrad(src, w.compute, g.compute, config.rms_norm_eps, mix.p, dout,
                                   &dsrc, &dw, &dg);
  }

  // RMSNorm backward from an fp32 upstream gradient; the input gradient in the compute dtype.
  StatusOr<Tensor> NormBackward(const Tensor& x, const Weight& w, const Tensor& rstd,
                                const Tensor& dy32) {
    kernels::PhaseScope scope("bwd.norm");
    ORRERY_ASSIGN_OR_RETURN(Tensor dy, gpu::As(dy32, options.compute_dtype));
    Tensor dx, dw = w.grad;
    ORRERY_RETURN_IF_ERROR(kernels::RmsNormGrad(x, w.compute, rstd, dy, &dx, &dw));
    return dx;
  }

  // The sequence mixer of layer l from lc.attn_in: lc.n1, lc.r1 and the mixer's cache; *a.
  Status MixerForward(int64_t l, const gpu::Sequences& seq, bool training, LayerCache& lc,
                      Tensor* a) {
    Layer& layer = layers[l];
    {
      kernels::PhaseScope scope("fwd.norm");
      ORRERY_RETURN_IF_ERROR(kernels::RmsNorm(lc.attn_in->v, layer.norm1.compute,
                                              config.rms_norm_eps, &lc.n1, &lc.r1));
    }
    if (layer.kda) return layer.kda->Forward(lc.n1, seq, training, a, &lc.kda);
    return layer.mla->Forward(lc.n1, seq, a, &lc.mla);
  }

  // The MLP or MoE of layer l from lc.mlp_in: lc.n2, lc.r2 and its cache; *f. `forced` replays a
  // routing (undefined: the router's top-k under `bias`).
  Status FeedForward(int64_t l, const Tensor& bias, const Tensor& forced, LayerCache& lc,
                     Tensor* f) {
    Layer& layer = layers[l];
    {
      kernels::PhaseScope scope("fwd.norm");
      ORRERY_RETURN_IF_ERROR(
          kernels::RmsNorm(lc.mlp_in->v, layer.norm2.compute, config.rms_norm_eps, &lc.n2, &lc.r2));
    }
    if (!layer.moe) {
      kernels::PhaseScope scope("fwd.mlp");
      return layer.mlp->Forward(lc.n2, f, &lc.mlp);
    }
    ORRERY_RETURN_IF_ERROR(layer.moe->Forward(lc.n2, bias, forced, f, &lc.moe));
    lc.ids = lc.moe.ids;
    return Status::OK();
  }

  // recompute_layers: releases what layer l's backward can rebuild from its inputs.
  static void Drop(LayerCache& lc) {
    lc.n1 = lc.r1 = lc.n2 = lc.r2 = Tensor();
    lc.kda = gpu::GpuKda::Cache();
    lc.mla = gpu::GpuMla::Cache();
    lc.moe = gpu::GpuMoe::Cache();
    lc.mlp = gpu::GpuMlp::Cache();
    lc.dropped = true;
  }

  // AttnResMix of `blocks` and the partial sum `partial` (no gradient kept).
  Status MixOnly(const std::vector<Tensor>& blocks, const Tensor& partial, const Weight& w,
                 const Weight& g, Tensor* h) {
    std::vector<Tensor> src = blocks;
    src.push_back(partial);
    return kernels::AttnResMix(src, w.compute, g.compute, config.rms_norm_eps, h, nullptr);
  }

  // The forward of Run without caches or loss (the same residual graph, layer by layer), the
  // mixers the pass's, then the next-token logits of the rows pass->last.
  // Uploads the balancing biases that changed since the last call (a small async copy each).
  Status SyncBiases() {
    if (bias_device.size() != biases.size()) {
      bias_device.clear();
      bias_uploaded.clear();
      for (const Tensor& b : biases) {
        ORRERY_ASSIGN_OR_RETURN(Tensor d, b.To(device));
        bias_device.push_back(d);
        bias_uploaded.push_back(b.Clone());
      }
      return Status::OK();
    }
    for (size_t l = 0; l < biases.size(); ++l) {
      if (std::memcmp(biases[l].raw_data(), bias_uploaded[l].raw_data(), biases[l].nbytes()) == 0) {
        continue;
      }
      ORRERY_RETURN_IF_ERROR(bias_device[l].CopyFrom(biases[l]));
      ORRERY_RETURN_IF_ERROR(bias_uploaded[l].CopyFrom(biases[l]));
    }
    return Status::OK();
  }

  Status Infer(gpu::InferencePass* pass) {
    const ModelConfig& c = config;
    const int64_t s = c.attn_res_block_size;
    if (bias_device.size() != biases.size()) {
      return FailedPreconditionError(
          "gpu model: inference before SyncInferenceInputs (the balancing biases' device copies)");
    }
    Tensor p, n1, r1, n2, r2;
    kernels::EmbeddingGatherOptions unchecked;  // the caller checked the ids: no read back
    unchecked.check_ids = false;
    ORRERY_RETURN_IF_ERROR(kernels::EmbeddingGather(embed.compute, pass->tokens, unchecked, &p));
    const int64_t n = pass->tokens.numel();
    std::vector<Tensor> blocks;
    pass->expert_ids.clear();
    int64_t moe_index = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer& layer = layers[l];
      Tensor attn_in = p;
      if (s > 0 && !blocks.empty()) {
        attn_in = Tensor();
        ORRERY_RETURN_IF_ERROR(MixOnly(blocks, p, layer.attn_res_w, layer.attn_res_g, &attn_in));
      }
      if (s > 0 && l % s == 0) {
        blocks.push_back(p);
        p = Tensor();
      }
      n1 = r1 = Tensor();
      ORRERY_RETURN_IF_ERROR(
          kernels::RmsNorm(attn_in, layer.norm1.compute, c.rms_norm_eps, &n1, &r1));
      Tensor a;
      ORRERY_RETURN_IF_ERROR(pass->mixer(l, layer.kda.get(), layer.mla.get(), n1, &a));
      if (p.defined()) {
        ORRERY_RETURN_IF_ERROR(kernels::AddInto(a, 1.0f, &p));
      } else {
        p = a;
      }
      Tensor mlp_in = p;
      if (s > 0) {
        mlp_in = Tensor();
        ORRERY_RETURN_IF_ERROR(MixOnly(blocks, p, layer.mlp_res_w, layer.mlp_res_g, &mlp_in));
      }
      n2 = r2 = Tensor();
      ORRERY_RETURN_IF_ERROR(
          kernels::RmsNorm(mlp_in, layer.norm2.compute, c.rms_norm_eps, &n2, &r2));
      Tensor f;
      if (layer.moe) {
        gpu::GpuMoe::Cache mc;
        if (pass->expert_ids_out.defined()) {  // the routing writes its slice of the output
          ORRERY_ASSIGN_OR_RETURN(Tensor slice,
                                  pass->expert_ids_out.Slice(moe_index, moe_index + 1));
          ORRERY_ASSIGN_OR_RETURN(mc.ids, slice.Reshape({n, c.moe.top_k}));
        }
        ORRERY_RETURN_IF_ERROR(
            layer.moe->Forward(n2, bias_device[static_cast<size_t>(moe_index)], Tensor(), &f, &mc));
        pass->expert_ids.push_back(mc.ids);
        ++moe_index;
      } else {
        gpu::GpuMlp::Cache mc;
        ORRERY_RETURN_IF_ERROR(layer.mlp->Forward(n2, &f, &mc));
      }
      // p is this pass's own partial sum (a block source is never added to: p starts afresh
      // after it is pushed), so the sublayer outputs add in place.
      ORRERY_RETURN_IF_ERROR(kernels::AddInto(f, 1.0f, &p));
    }
    Tensor h = p;
    if (s > 0) {
      h = Tensor();
      ORRERY_RETURN_IF_ERROR(MixOnly(blocks, p, out_res_w, out_res_g, &h));
    }
    Tensor hn, hr, last;
    ORRERY_RETURN_IF_ERROR(kernels::RmsNorm(h, final_norm.compute, c.rms_norm_eps, &hn, &hr));
    if (pass->last.defined()) {
      ORRERY_RETURN_IF_ERROR(kernels::GatherRows(hn, pass->last, &last));
    } else {
      last = hn;
    }
    // f32 logits: bf16 operands accumulate into an f32 output with beta = 1 (kernels/matmul.h).
    ORRERY_ASSIGN_OR_RETURN(pass->logits,
                            gpu::ZerosOn({last.dim(0), c.vocab_size}, DType::kF32, device));
    kernels::MatmulOptions o;
    o.trans_b = true;
    o.beta = options.compute_dtype == DType::kF32 ? 0.0f : 1.0f;
    return kernels::Matmul(last, head.compute, o, &pass->logits);
  }

  Status Run(const GpuBatch& batch, GpuLossHead* loss_head, const GpuPassOptions& pass) {
    const ModelConfig& c = config;
    const bool backward = pass.backward;
    kernels::PhaseScope upload_scope("batch.check_upload");
    ORRERY_RETURN_IF_ERROR(CheckBatch(batch, c));
    const int64_t n = static_cast<int64_t>(batch.tokens.size());
    gpu::Sequences seq;
    seq.n = n;
    std::vector<int64_t> cu = batch.cu_seqlens;
    if (cu.empty()) cu = {0, n};
    seq.cu_host = Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
    ORRERY_ASSIGN_OR_RETURN(seq.cu_device, seq.cu_host.To(device));
    ORRERY_ASSIGN_OR_RETURN(Tensor tokens,
                            Tensor::FromVector<int32_t>({n}, batch.tokens).To(device));
    if (pass.router_scores != nullptr) pass.router_scores->clear();
    upload_scope.Stop();

    // ---- forward ----
    Tensor emb;
    {
      kernels::PhaseScope scope("fwd.embed");
      ORRERY_RETURN_IF_ERROR(kernels::EmbeddingGather(embed.compute, tokens, &emb));
    }
    ValuePtr emb_node = NewValue(emb);
    const int64_t s = c.attn_res_block_size;
    ValuePtr p = emb_node;
    std::vector<ValuePtr> blocks;
    std::vector<LayerCache> lcs(static_cast<size_t>(c.num_layers));
    int64_t moe_index = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer& layer = layers[l];
      LayerCache& lc = lcs[l];
      lc.p_start = p;
      if (s > 0 && !blocks.empty()) {
        ORRERY_ASSIGN_OR_RETURN(
            lc.attn_in, MixForward(blocks, p, layer.attn_res_w, layer.attn_res_g, &lc.attn_mix));
      } else {
        lc.attn_in = p;
        lc.attn_mix.identity = true;
      }
      if (s > 0 && l % s == 0) {
        blocks.push_back(p);
        p = nullptr;
      }
      Tensor a;
      ORRERY_RETURN_IF_ERROR(MixerForward(l, seq, backward, lc, &a));
      lc.a = NewValue(a);
      if (p) {
        ORRERY_ASSIGN_OR_RETURN(lc.p_mid, Sum(p, lc.a));
      } else {
        lc.p_mid = lc.a;
      }
      p = lc.p_mid;
      if (s > 0) {
        ORRERY_ASSIGN_OR_RETURN(
            lc.mlp_in, MixForward(blocks, p, layer.mlp_res_w, layer.mlp_res_g, &lc.mlp_mix));
      } else {
        lc.mlp_in = p;
        lc.mlp_mix.identity = true;
      }
      Tensor f, bias;
      if (layer.moe) {
        ORRERY_ASSIGN_OR_RETURN(bias, biases[moe_index].To(device));
        Tensor forced;
        if (batch.forced_experts.defined()) {
          ORRERY_ASSIGN_OR_RETURN(Tensor fl, batch.forced_experts.Slice(moe_index, moe_index + 1));
          ORRERY_ASSIGN_OR_RETURN(fl, fl.Reshape({n, c.moe.top_k}));
          ORRERY_ASSIGN_OR_RETURN(forced, fl.To(device));
        }
        ORRERY_RETURN_IF_ERROR(FeedForward(l, bias, forced, lc, &f));
        // Kept for UpdateBalancing (on the device: only thresholds and loads leave it).
        if (backward && pass.keep_for_balancing) kept_scores[moe_index].push_back(lc.moe.scores);
        if (pass.router_scores != nullptr) {
          ORRERY_ASSIGN_OR_RETURN(Tensor scores, lc.moe.scores.To(Device::Cpu()));
          pass.router_scores->push_back(std::move(scores));
        }
        ++moe_index;
      } else {
        ORRERY_RETURN_IF_ERROR(FeedForward(l, bias, Tensor(), lc, &f));
      }
      lc.f = NewValue(f);
      kernels::PhaseScope residual("fwd.residual");
      ORRERY_ASSIGN_OR_RETURN(lc.p_end, Sum(p, lc.f));
      residual.Stop();
      p = lc.p_end;
      if (!backward || options.recompute_layers) Drop(lc);
    }
    Mix out_mix;
    ValuePtr h;
    if (s > 0) {
      ORRERY_ASSIGN_OR_RETURN(h, MixForward(blocks, p, out_res_w, out_res_g, &out_mix));
    } else {
      h = p;
      out_mix.identity = true;
    }
    Tensor hn, hr;
    kernels::PhaseScope head_scope("fwd_bwd.head_loss");
    ORRERY_RETURN_IF_ERROR(kernels::RmsNorm(h->v, final_norm.compute, c.rms_norm_eps, &hn, &hr));
    Tensor dhn, head_grad = head.grad;
    ORRERY_RETURN_IF_ERROR(loss_head->Run(hn, head.compute, backward, &dhn, &head_grad));
    if (!backward) return Status::OK();

    // ---- backward ----
    Tensor dh, final_grad = final_norm.grad;
    ORRERY_RETURN_IF_ERROR(
        kernels::RmsNormGrad(h->v, final_norm.compute, hr, dhn, &dh, &final_grad));
    head_scope.Stop();
    ORRERY_RETURN_IF_ERROR(MixBackward(out_mix, h, dh, out_res_w, out_res_g));
    for (int64_t l = c.num_layers - 1; l >= 0; --l) {
      Layer& layer = layers[l];
      LayerCache& lc = lcs[l];
      if (lc.dropped) {  // re-run the layer from its inputs, with the forward's routing
        kernels::PhaseScope scope("bwd.recompute");
        Tensor a, f;
        ORRERY_RETURN_IF_ERROR(MixerForward(l, seq, true, lc, &a));
        ORRERY_RETURN_IF_ERROR(FeedForward(l, Tensor(), lc.ids, lc, &f));
      }
      // p_end = p_mid + f.
      kernels::PhaseScope residual("bwd.residual");
      ORRERY_ASSIGN_OR_RETURN(Tensor * g_end, Grad(lc.p_end));
      ORRERY_ASSIGN_OR_RETURN(Tensor * g_mid, Grad(lc.p_mid));
      ORRERY_ASSIGN_OR_RETURN(Tensor * g_f, Grad(lc.f));
      ORRERY_RETURN_IF_ERROR(kernels::AddInto(*g_end, 1.0f, g_mid));
      ORRERY_RETURN_IF_ERROR(kernels::AddInto(*g_end, 1.0f, g_f));
      ORRERY_ASSIGN_OR_RETURN(Tensor df, gpu::As(*g_f, options.compute_dtype));
      residual.Stop();
      Tensor dn2;
      if (layer.moe) {
        ORRERY_RETURN_IF_ERROR(layer.moe->Backward(lc.moe, df, &dn2));
      } else {
        kernels::PhaseScope scope("bwd.mlp");
        ORRERY_RETURN_IF_ERROR(layer.mlp->Backward(lc.mlp, df, &dn2));
      }
      ORRERY_ASSIGN_OR_RETURN(Tensor dmlp_in, NormBackward(lc.mlp_in->v, layer.norm2, lc.r2, dn2));
      ORRERY_RETURN_IF_ERROR(
          MixBackward(lc.mlp_mix, lc.mlp_in, dmlp_in, layer.mlp_res_w, layer.mlp_res_g));
      // p_mid = p_start + a, or a alone at a block boundary.
      if (lc.p_mid != lc.a) {
        ORRERY_ASSIGN_OR_RETURN(Tensor * g_start, Grad(lc.p_start));
        ORRERY_ASSIGN_OR_RETURN(Tensor * g_a, Grad(lc.a));
        ORRERY_RETURN_IF_ERROR(kernels::AddInto(*g_mid, 1.0f, g_start));
        ORRERY_RETURN_IF_ERROR(kernels::AddInto(*g_mid, 1.0f, g_a));
      }
      ORRERY_ASSIGN_OR_RETURN(Tensor * g_a, Grad(lc.a));
      ORRERY_ASSIGN_OR_RETURN(Tensor da, gpu::As(*g_a, options.compute_dtype));
      Tensor dn1;
      if (layer.kda) {
        ORRERY_RETURN_IF_ERROR(layer.kda->Backward(lc.kda, seq, da, &dn1));
      } else {
        ORRERY_RETURN_IF_ERROR(layer.mla->Backward(lc.mla, seq, da, &dn1));
      }
      ORRERY_ASSIGN_OR_RETURN(Tensor dattn_in,
                              NormBackward(lc.attn_in->v, layer.norm1, lc.r1, dn1));
      ORRERY_RETURN_IF_ERROR(
          MixBackward(lc.attn_mix, lc.attn_in, dattn_in, layer.attn_res_w, layer.attn_res_g));
      lc = LayerCache();  // this layer's activations are no longer needed
    }
    kernels::PhaseScope embed_scope("bwd.embed");
    ORRERY_ASSIGN_OR_RETURN(Tensor * g_emb, Grad(emb_node));
    ORRERY_ASSIGN_OR_RETURN(Tensor demb, gpu::As(*g_emb, options.compute_dtype));
    Tensor embed_grad = embed.grad;
    return kernels::EmbeddingScatterAdd(tokens, demb, &embed_grad);
  }
};

GpuModel::GpuModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuModel::~GpuModel() = default;

StatusOr<std::unique_ptr<GpuModel>> GpuModel::FromHost(Model& host,
                                                       const GpuModelOptions& options) {
  if (options.device.is_cpu() && options.compute_dtype != DType::kF32) {
    return InvalidArgumentError(
        "gpu model: on the cpu (the ops' CPU twins) the compute dtype "
        "must be f32, got " +
        std::string(DTypeName(options.compute_dtype)));
  }
  if (options.device.is_cuda() &&
      (!CudaCompiledIn() || CudaDeviceCount() <= options.device.index)) {
    return FailedPreconditionError("gpu model: no CUDA device " +
                                   std::to_string(options.device.index) +
                                   " is visible to this process" +
                                   (CudaCompiledIn() ? "" : " (this build has no CUDA support)"));
  }
  if (host.dtype() != DType::kF32) {
    return InvalidArgumentError("gpu model: the host model must be f32, got " +
                                std::string(DTypeName(host.dtype())));
  }
  if (options.compute_dtype != DType::kBF16 && options.compute_dtype != DType::kF32) {
    return InvalidArgumentError("gpu model: compute dtype must be bf16 or f32, got " +
                                std::string(DTypeName(options.compute_dtype)));
  }
  auto impl = std::make_unique<Impl>();
  impl->config = host.config();
  impl->options = options;
  impl->device = options.device;
  ORRERY_RETURN_IF_ERROR(impl->Build(host));
  return std::unique_ptr<GpuModel>(new GpuModel(std::move(impl)));
}

const ModelConfig& GpuModel::config() const { return impl_->config; }
DType GpuModel::compute_dtype() const { return impl_->options.compute_dtype; }
Device GpuModel::device() const { return impl_->device; }
std::vector<GpuParameter>& GpuModel::parameters() { return impl_->params; }
std::vector<Tensor>& GpuModel::balancing_biases() { return impl_->biases; }

std::vector<std::pair<std::string, Tensor>> GpuModel::NamedMasters() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const GpuParameter& p : impl_->params) out.emplace_back(p.name, p.master);
  const ModelConfig& c = impl_->config;
  for (size_t i = 0; i < impl_->biases.size(); ++i) {
    out.emplace_back("layers." + std::to_string(c.first_k_dense + static_cast<int64_t>(i)) +
                         ".moe.balancing_bias",
                     impl_->biases[i]);
  }
  return out;
}

StatusOr<GpuLoss> GpuModel::ForwardBackward(const GpuBatch& batch, double grad_scale,
                                            bool backward) {
  CrossEntropyHead head(batch, grad_scale);
  GpuPassOptions o;
  o.backward = backward;
  ORRERY_RETURN_IF_ERROR(impl_->Run(batch, &head, o));
  return head.loss;
}

Status GpuModel::ForwardBackwardWith(const GpuBatch& batch, GpuLossHead* head,
                                     const GpuPassOptions& options) {
  if (head == nullptr) return InvalidArgumentError("gpu model: ForwardBackwardWith needs a head");
  return impl_->Run(batch, head, options);
}

Status GpuModel::RunInference(gpu::InferencePass* pass) { return impl_->Infer(pass); }

const gpu::GpuMla* GpuModel::mla_layer(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(impl_->layers.size())) return nullptr;
  return impl_->layers[static_cast<size_t>(layer)].mla.get();
}

Status GpuModel::SyncInferenceInputs() { return impl_->SyncBiases(); }

Status GpuModel::UpdateBalancing(BalancingMetrics* metrics, const RankGroup& group) {
  const ModelConfig& c = impl_->config;
  *metrics = BalancingMetrics();
  std::vector<std::vector<Tensor>> kept;
  kept.swap(impl_->kept_scores);
  impl_->kept_scores.assign(impl_->biases.size(), {});
  if (c.moe.balancing == Balancing::kNone || c.num_moe_layers() == 0) return Status::OK();
  for (size_t l = 0; l < impl_->biases.size(); ++l) {
    if (kept[l].empty() && group.world <= 1) continue;  // several ranks: each takes part
    kernels::PhaseScope scope("balancing.layer");
    QuantileBalancingResult r;
    ORRERY_RETURN_IF_ERROR(
        QuantileBalancingStepWhereScoresAre(kept[l], c.moe, &impl_->biases[l], &r, group));
    metrics->load.push_back(r.load);
    metrics->max_violation_before.push_back(r.max_violation_before);
    metrics->max_violation_after.push_back(r.max_violation_after);
    metrics->bias_change.push_back(r.bias_change);
  }
  return Status::OK();
}

Status GpuModel::ZeroGrad() {
  for (Weight& w : impl_->roots) ORRERY_RETURN_IF_ERROR(w.grad.SetZero());
  return Status::OK();
}

Status GpuModel::RefreshComputeCopies() {
  if (impl_->options.compute_dtype == DType::kF32) return Status::OK();
  for (Weight& w : impl_->roots) ORRERY_RETURN_IF_ERROR(kernels::CastInto(w.master, &w.compute));
  return Status::OK();
}

Status GpuModel::CopyToHost(Model* host) const {
  if (host->parameters().size() != impl_->params.size()) {
    return InvalidArgumentError("gpu model: CopyToHost into a model of another config");
  }
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    Parameter& hp = host->parameters()[i];
    const GpuParameter& gp = impl_->params[i];
    if (hp.name != gp.name || hp.value.shape() != gp.master.shape()) {
      return InvalidArgumentError("gpu model: CopyToHost: parameter " + gp.name +
                                  " does not match the host's " + hp.name);
    }
    ORRERY_RETURN_IF_ERROR(hp.value.CopyFrom(gp.master));
  }
  for (size_t l = 0; l < impl_->biases.size(); ++l) {
    ORRERY_RETURN_IF_ERROR(host->balancing_biases()[l].CopyFrom(impl_->biases[l]));
  }
  return Status::OK();
}

}  // namespace orrery::model
