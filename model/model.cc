// The hybrid stack (spec §4, §6.2): embedding, per layer [AttnRes mix -> RMSNorm -> KDA or MLA]
// and [AttnRes mix -> RMSNorm -> dense MLP or LatentMoE], output mix, final norm, LM head.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "core/safetensors.h"
#include "kernels/attn_res.h"
#include "kernels/rmsnorm.h"
#include "model/inference_state_impl.h"
#include "model/layers.h"
#include "model/quantile_balancing.h"

namespace orrery::model {

// A node of the residual graph: an activation [N, D] and its gradient.
struct Value {
  Tensor v, g;
};
using ValuePtr = std::shared_ptr<Value>;

struct ForwardCache::Impl {
  std::vector<Tensor> expert_ids, router_scores;
  std::shared_ptr<void> state;  // ModelCache<T>
  DType dtype = DType::kF32;
};

ForwardCache::ForwardCache() : impl_(std::make_unique<Impl>()) {}
ForwardCache::~ForwardCache() = default;
ForwardCache::ForwardCache(ForwardCache&&) noexcept = default;
ForwardCache& ForwardCache::operator=(ForwardCache&&) noexcept = default;
const std::vector<Tensor>& ForwardCache::expert_ids() const { return impl_->expert_ids; }
const std::vector<Tensor>& ForwardCache::router_scores() const { return impl_->router_scores; }
Tensor ForwardCache::StackedExpertIds() const {
  const auto& ids = impl_->expert_ids;
  if (ids.empty()) return Tensor();
  const int64_t n = ids[0].dim(0), k = ids[0].dim(1);
  Tensor out = Tensor::Empty({static_cast<int64_t>(ids.size()), n, k}, DType::kI32);
  for (size_t l = 0; l < ids.size(); ++l) {
    std::copy_n(ids[l].data<int32_t>(), n * k, out.data<int32_t>() + l * n * k);
  }
  return out;
}

class Model::Impl {
 public:
  virtual ~Impl() = default;
  ModelConfig config;
  DType dtype;
  std::vector<Parameter> params;
  std::vector<Tensor> biases;  // f32 [E] per MoE layer
  virtual StatusOr<Tensor> Forward(const Batch& batch, ForwardCache* cache) = 0;
  virtual Status Backward(const ForwardCache& cache, const Tensor& dlogits) = 0;
  virtual StatusOr<StepOutput> Extend(InferenceState* state, const std::vector<int64_t>& slots,
                                      const std::vector<std::vector<int32_t>>& segments) = 0;
};

namespace {

template <typename T>
struct Mix {
  std::vector<ValuePtr> sources;
  Tensor p;               // [N, n_sources]
  bool identity = false;  // no AttnRes: the output is sources.back() itself
};

template <typename T>
struct LayerCache {
  Mix<T> attn_mix, mlp_mix;
  ValuePtr p_start, attn_in, a, p_mid, mlp_in, f, p_end;
  bool boundary = false;
  Tensor n1, r1, n2, r2;  // RMSNorm outputs and rstd
  std::unique_ptr<typename KdaLayer<T>::Cache> kda;
  std::unique_ptr<typename MlaLayer<T>::Cache> mla;
  std::unique_ptr<typename MoeLayer<T>::Cache> moe;
  std::unique_ptr<typename GluMlp<T>::Cache> mlp;
};

template <typename T>
struct ModelCache {
  Tensor tokens;
  std::vector<int64_t> cu;
  int64_t n = 0;
  ValuePtr emb;
  std::vector<LayerCache<T>> layers;
  Mix<T> out_mix;
  ValuePtr h;
  Tensor hn, hr;
};

std::vector<int64_t> Offsets(const Batch& batch, int64_t b, int64_t t, Status* status) {
  std::vector<int64_t> cu;
  if (!batch.cu_seqlens.defined()) {
    for (int64_t i = 0; i <= b; ++i) cu.push_back(i * t);
    return cu;
  }
  const Tensor& c = batch.cu_seqlens;
  if (c.dtype() != DType::kI64 || c.ndim() != 1 || c.numel() < 2) {
    *status = InvalidArgumentError("cu_seqlens: expected i64 [n_docs + 1], got " + c.ToString());
    return {};
  }
  cu.assign(c.data<int64_t>(), c.data<int64_t>() + c.numel());
  if (cu.front() != 0 || cu.back() != b * t) {
    *status = InvalidArgumentError("cu_seqlens: must start at 0 and end at B*T = " +
                                   std::to_string(b * t));
    return {};
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] <= cu[i - 1]) {
      *status = InvalidArgumentError("cu_seqlens: must be strictly increasing (entry " +
                                     std::to_string(i) + ")");
      return {};
    }
  }
  for (int64_t r = 1; r < b; ++r) {
    if (!std::binary_search(cu.begin(), cu.end(), r * t)) {
      *status = InvalidArgumentError("cu_seqlens: must contain every row start; " +
                                     std::to_string(r * t) + " is missing");
      return {};
    }
  }
  return cu;
}

template <typename T>
class ModelImpl final : public Model::Impl {
 public:
  ModelImpl(const ModelConfig& c, uint64_t seed) {
    config = c;
    dtype = DTypeOf<T>::value;
    const int64_t d = c.hidden_size;
    ParamStore store(&params, seed, dtype, &config);
    int64_t num_kda = 0, num_mla = 0;
    embed_ = store.Add<T>("embed", {c.vocab_size, d}, Init::kNormal, 1.0, true);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "layers." + std::to_string(l);
      Layer layer;
      if (c.attn_res_block_size > 0) {
        layer.attn_res_w = store.Add<T>(p + ".attn_res_proj", {d}, Init::kZeros, 0, false);
        layer.attn_res_g = store.Add<T>(p + ".attn_res_norm", {d}, Init::kOnes, 0, false);
        layer.mlp_res_w = store.Add<T>(p + ".mlp_res_proj", {d}, Init::kZeros, 0, false);
        layer.mlp_res_g = store.Add<T>(p + ".mlp_res_norm", {d}, Init::kOnes, 0, false);
      }
      layer.norm1 = store.Add<T>(p + ".input_norm", {d}, Init::kOnes, 0, false);
      if (c.layers[l] == LayerKind::kKda) {
        layer.kda = std::make_unique<KdaLayer<T>>(store, config, p + ".kda");
        kind_index_.push_back(num_kda++);
      } else {
        layer.mla = std::make_unique<MlaLayer<T>>(store, config, p + ".mla");
        kind_index_.push_back(num_mla++);
      }
      layer.norm2 = store.Add<T>(p + ".post_attn_norm", {d}, Init::kOnes, 0, false);
      if (c.is_moe_layer(l)) {
        layer.moe = std::make_unique<MoeLayer<T>>(store, config, p + ".moe");
        biases.push_back(Tensor::Zeros({c.moe.num_experts}, DType::kF32));
      } else {
        layer.mlp = std::make_unique<GluMlp<T>>(store, config, p + ".mlp", d, c.dense_intermediate);
      }
      layers_.push_back(std::move(layer));
    }
    if (c.attn_res_block_size > 0) {
      out_res_w_ = store.Add<T>("output_attn_res_proj", {d}, Init::kZeros, 0, false);
      out_res_g_ = store.Add<T>("output_attn_res_norm", {d}, Init::kOnes, 0, false);
    }
    final_norm_ = store.Add<T>("final_norm", {d}, Init::kOnes, 0, false);
    head_ = store.Add<T>("lm_head", {c.vocab_size, d}, Init::kNormal,
                         1.0 / std::sqrt(static_cast<double>(d)), true);
  }

  StatusOr<Tensor> Forward(const Batch& batch, ForwardCache* out_cache) override {
    const ModelConfig& c = config;
    const Tensor& tok = batch.tokens;
    if (!tok.defined() || tok.dtype() != DType::kI32 || tok.ndim() != 2 || tok.numel() == 0) {
      return InvalidArgumentError("tokens: expected i32 [B, T], got " +
                                  (tok.defined() ? tok.ToString() : std::string("none")));
    }
    const int64_t n = tok.numel(), d = c.hidden_size;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = tok.data<int32_t>()[i];
      if (id < 0 || id >= c.vocab_size) {
        return InvalidArgumentError("tokens: id " + std::to_string(id) + " at position " +
                                    std::to_string(i) + " is outside the vocabulary [0, " +
                                    std::to_string(c.vocab_size) + ")");
      }
    }
    Status st;
    std::vector<int64_t> cu = Offsets(batch, tok.dim(0), tok.dim(1), &st);
    ORRERY_RETURN_IF_ERROR(st);
    const int64_t nmoe = c.num_moe_layers();
    if (batch.forced_experts.defined()) {
      const Tensor& f = batch.forced_experts;
      if (f.dtype() != DType::kI32 || f.shape() != Shape{nmoe, n, c.moe.top_k}) {
        return InvalidArgumentError("forced_experts: expected i32 " +
                                    ShapeToString({nmoe, n, c.moe.top_k}) + ", got " +
                                    f.ToString());
      }
    }
    auto mc = std::make_shared<ModelCache<T>>();
    mc->tokens = tok;
    mc->cu = cu;
    mc->n = n;
    ForwardCache::Impl* fc = out_cache ? out_cache->impl() : nullptr;
    std::vector<Tensor> ids, scores;
    const Mixer mixer = [&](int64_t l, const T* x, T* y, LayerCache<T>& lc) -> Status {
      Layer& layer = layers_[static_cast<size_t>(l)];
      if (layer.kda) {
        lc.kda = std::make_unique<typename KdaLayer<T>::Cache>();
        return layer.kda->Forward(x, n, cu, y, lc.kda.get());
      }
      lc.mla = std::make_unique<typename MlaLayer<T>::Cache>();
      layer.mla->Forward(x, n, cu, y, lc.mla.get());
      return Status::OK();
    };
    const int32_t* forced =
        batch.forced_experts.defined() ? batch.forced_experts.data<int32_t>() : nullptr;
    ORRERY_RETURN_IF_ERROR(Stack(mc.get(), forced, mixer, &ids, fc ? &scores : nullptr));
    Tensor logits = Uninit<T>({n, c.vocab_size});
    LinearForward(Ptr<T>(mc->hn), n, d, head_, c.vocab_size, Ptr<T>(logits));
    if (fc) {
      fc->expert_ids = std::move(ids);
      fc->router_scores = std::move(scores);
      fc->state = mc;
      fc->dtype = dtype;
    }
    return logits;
  }

  StatusOr<StepOutput> Extend(InferenceState* state, const std::vector<int64_t>& slots,
                              const std::vector<std::vector<int32_t>>& segments) override {
    const ModelConfig& c = config;
    const int64_t d = c.hidden_size;
    ORRERY_RETURN_IF_ERROR(CheckExtend(state, slots, segments));
    InferenceState::Impl& st = *state->impl();
    const int64_t ns = static_cast<int64_t>(slots.size());
    std::vector<int64_t> cu{0};
    std::vector<int32_t> flat;
    for (const auto& seg : segments) {
      flat.insert(flat.end(), seg.begin(), seg.end());
      cu.push_back(static_cast<int64_t>(flat.size()));
    }
    const int64_t n = cu.back();
    auto mc = std::make_shared<ModelCache<T>>();
    mc->tokens = Tensor::FromVector<int32_t>({1, n}, flat);
    mc->cu = cu;
    mc->n = n;
    // Gather the KDA and conv state of the slots in call order (written back only on success).
    std::vector<Tensor> kda_state, conv_state;
    for (size_t i = 0; i < st.kda_state.size(); ++i) {
      kda_state.push_back(GatherRows(st.kda_state[i], slots, st.num_slots));
      conv_state.push_back(GatherRows(st.conv_state[i], slots, st.num_slots));
    }
    std::vector<int64_t> past;
    for (int64_t s = 0; s < ns; ++s) {
      past.push_back(st.length[static_cast<size_t>(slots[s])]);
      st.Reserve(slots[s], past.back() + cu[s + 1] - cu[s]);
    }
    std::vector<std::vector<T*>> caches(st.mla_cache.size());
    for (size_t i = 0; i < st.mla_cache.size(); ++i) {
      for (int64_t slot : slots) caches[i].push_back(Ptr<T>(st.mla_cache[i][slot]));
    }
    const Mixer mixer = [&](int64_t l, const T* x, T* y, LayerCache<T>&) -> Status {
      Layer& layer = layers_[static_cast<size_t>(l)];
      const size_t index = static_cast<size_t>(kind_index_[static_cast<size_t>(l)]);
      if (layer.kda) {
        return layer.kda->Infer(x, n, cu, Ptr<T>(conv_state[index]), &kda_state[index], y);
      }
      layer.mla->Infer(x, n, cu, caches[index], past, y);
      return Status::OK();
    };
    std::vector<Tensor> ids;
    ORRERY_RETURN_IF_ERROR(Stack(mc.get(), nullptr, mixer, &ids, nullptr));
    // Next-token logits from the last position of each segment.
    Tensor last = NewTensor<T>({ns, d});
    for (int64_t s = 0; s < ns; ++s) {
      std::copy_n(Ptr<T>(mc->hn) + (cu[s + 1] - 1) * d, d, Ptr<T>(last) + s * d);
    }
    StepOutput out;
    out.logits = Uninit<T>({ns, c.vocab_size});
    LinearForward(Ptr<T>(last), ns, d, head_, c.vocab_size, Ptr<T>(out.logits));
    const int64_t nmoe = static_cast<int64_t>(ids.size()), k = c.moe.top_k;
    out.expert_ids = Tensor::Zeros({nmoe, n, nmoe > 0 ? k : 0}, DType::kI32);
    for (int64_t l = 0; l < nmoe; ++l) {
      std::copy_n(ids[l].data<int32_t>(), n * k, out.expert_ids.data<int32_t>() + l * n * k);
    }
    // Commit.
    for (size_t i = 0; i < st.kda_state.size(); ++i) {
      ScatterRows(kda_state[i], slots, st.num_slots, &st.kda_state[i]);
      ScatterRows(conv_state[i], slots, st.num_slots, &st.conv_state[i]);
    }
    for (int64_t s = 0; s < ns; ++s) {
      st.length[static_cast<size_t>(slots[s])] = past[s] + cu[s + 1] - cu[s];
    }
    return out;
  }

  Status Backward(const ForwardCache& cache, const Tensor& dlogits) override {
    const ForwardCache::Impl* fc = cache.impl();
    if (!fc->state || fc->dtype != dtype) {
      return FailedPreconditionError("Backward: the cache holds no forward of this model");
    }
    auto* mc = static_cast<ModelCache<T>*>(fc->state.get());
    const ModelConfig& c = config;
    const int64_t n = mc->n, d = c.hidden_size;
    if (dlogits.dtype() != dtype || dlogits.shape() != Shape{n, c.vocab_size}) {
      return InvalidArgumentError("dlogits: expected " + std::string(DTypeName(dtype)) + " " +
                                  ShapeToString({n, c.vocab_size}) + ", got " + dlogits.ToString());
    }
    // Fresh gradients on every node (a cache may be backpropagated more than once).
    ResetGrads(*mc);
    Tensor dhn = NewTensor<T>({n, d});
    LinearBackward(Ptr<T>(mc->hn), n, d, head_, c.vocab_size, Ptr<T>(dlogits), Ptr<T>(dhn));
    Tensor dh = Uninit<T>({n, d});
    kernels::RmsNormBackward(Ptr<T>(mc->h->v), final_norm_.w, Ptr<T>(mc->hr), Ptr<T>(dhn), n, d,
                             Ptr<T>(dh), final_norm_.g);
    MixBackward(mc->out_mix, mc->h, dh, out_res_w_, out_res_g_, n);
    for (int64_t l = c.num_layers - 1; l >= 0; --l) {
      Layer& layer = layers_[l];
      LayerCache<T>& lc = mc->layers[l];
      // p_end = p_mid + f.
      AddInto(lc.p_mid, lc.p_end->g, n);
      AddInto(lc.f, lc.p_end->g, n);
      Tensor dn2 = NewTensor<T>({n, d});
      if (layer.moe) {
        layer.moe->Backward(Ptr<T>(lc.n2), n, *lc.moe, Ptr<T>(lc.f->g), Ptr<T>(dn2));
      } else {
        layer.mlp->Backward(Ptr<T>(lc.n2), n, *lc.mlp, Ptr<T>(lc.f->g), Ptr<T>(dn2));
      }
      Tensor dmlp_in = Uninit<T>({n, d});
      kernels::RmsNormBackward(Ptr<T>(lc.mlp_in->v), layer.norm2.w, Ptr<T>(lc.r2), Ptr<T>(dn2), n,
                               d, Ptr<T>(dmlp_in), layer.norm2.g);
      MixBackward(lc.mlp_mix, lc.mlp_in, dmlp_in, layer.mlp_res_w, layer.mlp_res_g, n);
      // p_mid = p_start + a, or a alone at a block boundary.
      if (lc.p_mid != lc.a) {
        AddInto(lc.p_start, lc.p_mid->g, n);
        AddInto(lc.a, lc.p_mid->g, n);
      }
      Tensor dn1 = NewTensor<T>({n, d});
      if (layer.kda) {
        ORRERY_RETURN_IF_ERROR(
            layer.kda->Backward(Ptr<T>(lc.n1), n, mc->cu, *lc.kda, Ptr<T>(lc.a->g), Ptr<T>(dn1)));
      } else {
        layer.mla->Backward(Ptr<T>(lc.n1), n, mc->cu, *lc.mla, Ptr<T>(lc.a->g), Ptr<T>(dn1));
      }
      Tensor dattn_in = Uninit<T>({n, d});
      kernels::RmsNormBackward(Ptr<T>(lc.attn_in->v), layer.norm1.w, Ptr<T>(lc.r1), Ptr<T>(dn1), n,
                               d, Ptr<T>(dattn_in), layer.norm1.g);
      MixBackward(lc.attn_mix, lc.attn_in, dattn_in, layer.attn_res_w, layer.attn_res_g, n);
    }
    const T* de = Ptr<T>(mc->emb->g);
    for (int64_t i = 0; i < n; ++i) {
      T* row = embed_.g + mc->tokens.template data<int32_t>()[i] * d;
      for (int64_t j = 0; j < d; ++j) row[j] += de[i * d + j];
    }
    return Status::OK();
  }

 private:
  struct Layer {
    Param<T> attn_res_w, attn_res_g, mlp_res_w, mlp_res_g, norm1, norm2;
    std::unique_ptr<KdaLayer<T>> kda;
    std::unique_ptr<MlaLayer<T>> mla;
    std::unique_ptr<MoeLayer<T>> moe;
    std::unique_ptr<GluMlp<T>> mlp;
  };

  // The sequence mixer of layer l: y [n, D] from the normed input x [n, D].
  using Mixer = std::function<Status(int64_t l, const T* x, T* y, LayerCache<T>& lc)>;

  // The hybrid stack over mc->tokens (flattened, mc->n rows): embedding, per layer [mix -> norm ->
  // mixer] and [mix -> norm -> MLP or MoE], output mix and final norm (into mc->hn). Routing of
  // every MoE layer goes to ids (and the router scores to scores when non-null); forced is null
  // or [num_moe_layers, n, top_k].
  Status Stack(ModelCache<T>* mc, const int32_t* forced, const Mixer& mixer,
               std::vector<Tensor>* ids, std::vector<Tensor>* scores) {
    const ModelConfig& c = config;
    const int64_t n = mc->n, d = c.hidden_size;
    mc->emb = NewValue(n);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(embed_.w + mc->tokens.template data<int32_t>()[i] * d, d,
                  Ptr<T>(mc->emb->v) + i * d);
    }
    const int64_t s = c.attn_res_block_size;
    ValuePtr p = mc->emb;
    std::vector<ValuePtr> blocks;
    int64_t moe_index = 0;
    mc->layers.resize(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer& layer = layers_[l];
      LayerCache<T>& lc = mc->layers[l];
      lc.p_start = p;
      // 1. attention input.
      if (s > 0 && !blocks.empty()) {
        lc.attn_in = MixForward(blocks, p, layer.attn_res_w, layer.attn_res_g, &lc.attn_mix, n);
      } else {
        lc.attn_in = p;
        lc.attn_mix.identity = true;
      }
      // 2. block boundary.
      if (s > 0 && l % s == 0) {
        blocks.push_back(p);
        p = nullptr;
        lc.boundary = true;
      }
      // 3. sequence mixer.
      lc.n1 = Uninit<T>({n, d});
      lc.r1 = Uninit<T>({n});
      kernels::RmsNormForward(Ptr<T>(lc.attn_in->v), layer.norm1.w, n, d, c.rms_norm_eps,
                              Ptr<T>(lc.n1), Ptr<T>(lc.r1));
      lc.a = NewValue(n);
      ORRERY_RETURN_IF_ERROR(mixer(l, Ptr<T>(lc.n1), Ptr<T>(lc.a->v), lc));
      lc.p_mid = p ? Add(p, lc.a, n) : lc.a;
      p = lc.p_mid;
      // 4. MLP input.
      if (s > 0) {
        lc.mlp_in = MixForward(blocks, p, layer.mlp_res_w, layer.mlp_res_g, &lc.mlp_mix, n);
      } else {
        lc.mlp_in = p;
        lc.mlp_mix.identity = true;
      }
      // 5. MLP / MoE.
      lc.n2 = Uninit<T>({n, d});
      lc.r2 = Uninit<T>({n});
      kernels::RmsNormForward(Ptr<T>(lc.mlp_in->v), layer.norm2.w, n, d, c.rms_norm_eps,
                              Ptr<T>(lc.n2), Ptr<T>(lc.r2));
      lc.f = NewValue(n);
      if (layer.moe) {
        lc.moe = std::make_unique<typename MoeLayer<T>::Cache>();
        const int32_t* f = forced ? forced + moe_index * n * c.moe.top_k : nullptr;
        ORRERY_RETURN_IF_ERROR(layer.moe->Forward(
            Ptr<T>(lc.n2), n, f, biases[moe_index].data<float>(), Ptr<T>(lc.f->v), lc.moe.get()));
        ids->push_back(lc.moe->ids);
        if (scores) {
          ORRERY_ASSIGN_OR_RETURN(Tensor sc, lc.moe->scores.Cast(DType::kF32));
          scores->push_back(sc);
        }
        ++moe_index;
      } else {
        lc.mlp = std::make_unique<typename GluMlp<T>::Cache>();
        layer.mlp->Forward(Ptr<T>(lc.n2), n, Ptr<T>(lc.f->v), lc.mlp.get());
      }
      lc.p_end = Add(p, lc.f, n);
      p = lc.p_end;
    }
    if (s > 0) {
      mc->h = MixForward(blocks, p, out_res_w_, out_res_g_, &mc->out_mix, n);
    } else {
      mc->h = p;
      mc->out_mix.identity = true;
    }
    mc->hn = Uninit<T>({n, d});
    mc->hr = Uninit<T>({n});
    kernels::RmsNormForward(Ptr<T>(mc->h->v), final_norm_.w, n, d, config.rms_norm_eps,
                            Ptr<T>(mc->hn), Ptr<T>(mc->hr));
    return Status::OK();
  }

  // Every argument of Extend checked before anything changes.
  Status CheckExtend(InferenceState* state, const std::vector<int64_t>& slots,
                     const std::vector<std::vector<int32_t>>& segments) const {
    if (state == nullptr) return InvalidArgumentError("inference: no state given");
    const InferenceState::Impl& st = *state->impl();
    if (st.dtype != dtype || static_cast<int64_t>(st.kda_state.size()) != config.num_kda_layers() ||
        static_cast<int64_t>(st.mla_cache.size()) != config.num_mla_layers() ||
        st.latent_width != config.mla.kv_lora_rank + config.mla.qk_rope_head_dim ||
        st.conv_rows != config.kda.conv_size - 1) {
      return InvalidArgumentError("inference: the state was made for a different model");
    }
    if (slots.empty()) return InvalidArgumentError("inference: no slots given");
    if (slots.size() != segments.size()) {
      return InvalidArgumentError("inference: " + std::to_string(slots.size()) + " slots but " +
                                  std::to_string(segments.size()) + " token lists");
    }
    std::vector<bool> seen(static_cast<size_t>(st.num_slots), false);
    for (size_t i = 0; i < slots.size(); ++i) {
      ORRERY_RETURN_IF_ERROR(state->CheckSlot(slots[i]));
      if (seen[static_cast<size_t>(slots[i])]) {
        return InvalidArgumentError("inference: slot " + std::to_string(slots[i]) +
                                    " appears twice in one call");
      }
      seen[static_cast<size_t>(slots[i])] = true;
      if (segments[i].empty()) {
        return InvalidArgumentError("inference: the token list of slot " +
                                    std::to_string(slots[i]) + " is empty");
      }
      for (int32_t id : segments[i]) {
        if (id < 0 || id >= config.vocab_size) {
          return InvalidArgumentError("inference: token id " + std::to_string(id) + " for slot " +
                                      std::to_string(slots[i]) + " is outside the vocabulary [0, " +
                                      std::to_string(config.vocab_size) + ")");
        }
      }
      const int64_t total =
          st.length[static_cast<size_t>(slots[i])] + static_cast<int64_t>(segments[i].size());
      if (st.options.max_tokens_per_slot > 0 && total > st.options.max_tokens_per_slot) {
        return ResourceExhaustedError(
            "inference: slot " + std::to_string(slots[i]) + " would hold " + std::to_string(total) +
            " tokens, more than max_tokens_per_slot = " +
            std::to_string(st.options.max_tokens_per_slot) + " (the model's max_seq_len is " +
            std::to_string(config.max_seq_len) + ")");
      }
    }
    return Status::OK();
  }

  // rows [slots.size(), ...] of `all` [num_slots, ...] in the order of `slots`.
  static Tensor GatherRows(const Tensor& all, const std::vector<int64_t>& slots,
                           int64_t num_slots) {
    Shape shape = all.shape();
    shape[0] = static_cast<int64_t>(slots.size());
    Tensor out = Tensor::Empty(shape, all.dtype());
    const size_t per = all.nbytes() / static_cast<size_t>(num_slots);
    for (size_t i = 0; i < slots.size(); ++i) {
      std::memcpy(static_cast<char*>(out.raw_data()) + i * per,
                  static_cast<const char*>(all.raw_data()) + slots[i] * per, per);
    }
    return out;
  }
  static void ScatterRows(const Tensor& rows, const std::vector<int64_t>& slots, int64_t num_slots,
                          Tensor* all) {
    const size_t per = all->nbytes() / static_cast<size_t>(num_slots);
    for (size_t i = 0; i < slots.size(); ++i) {
      std::memcpy(static_cast<char*>(all->raw_data()) + slots[i] * per,
                  static_cast<const char*>(rows.raw_data()) + i * per, per);
    }
  }

  ValuePtr NewValue(int64_t n) {
    auto v = std::make_shared<Value>();
    v->v = NewTensor<T>({n, config.hidden_size});
    return v;
  }
  ValuePtr Add(const ValuePtr& a, const ValuePtr& b, int64_t n) {
    ValuePtr out = NewValue(n);
    const int64_t m = n * config.hidden_size;
    for (int64_t i = 0; i < m; ++i) {
      Ptr<T>(out->v)[i] = Ptr<T>(a->v)[i] + Ptr<T>(b->v)[i];
    }
    return out;
  }
  void AddInto(const ValuePtr& dst, const Tensor& g, int64_t n) {
    if (!dst->g.defined()) dst->g = NewTensor<T>({n, config.hidden_size});
    const int64_t m = n * config.hidden_size;
    for (int64_t i = 0; i < m; ++i) Ptr<T>(dst->g)[i] += Ptr<T>(g)[i];
  }
  void ResetGrads(ModelCache<T>& mc) {
    auto reset = [&](const ValuePtr& v) {
      if (v) v->g = NewTensor<T>({mc.n, config.hidden_size});
    };
    reset(mc.emb);
    reset(mc.h);
    for (auto& lc : mc.layers) {
      for (const ValuePtr& v : {lc.attn_in, lc.a, lc.p_mid, lc.mlp_in, lc.f, lc.p_end}) reset(v);
    }
  }

  ValuePtr MixForward(const std::vector<ValuePtr>& blocks, const ValuePtr& partial,
                      const Param<T>& w, const Param<T>& g, Mix<T>* mix, int64_t n) {
    mix->sources = blocks;
    mix->sources.push_back(partial);
    std::vector<const T*> src;
    for (const ValuePtr& v : mix->sources) src.push_back(Ptr<T>(v->v));
    mix->p = NewTensor<T>({n, static_cast<int64_t>(src.size())});
    ValuePtr out = NewValue(n);
    kernels::AttnResForward(src, n, config.hidden_size, w.w, g.w, config.rms_norm_eps,
                            Ptr<T>(out->v), Ptr<T>(mix->p));
    return out;
  }
  void MixBackward(const Mix<T>& mix, const ValuePtr& out, const Tensor& dout, const Param<T>& w,
                   const Param<T>& g, int64_t n) {
    if (mix.identity) {
      AddInto(out, dout, n);
      return;
    }
    std::vector<const T*> src;
    std::vector<T*> dsrc;
    for (const ValuePtr& v : mix.sources) {
      if (!v->g.defined()) v->g = NewTensor<T>({n, config.hidden_size});
      src.push_back(Ptr<T>(v->v));
      dsrc.push_back(Ptr<T>(v->g));
    }
    kernels::AttnResBackward(src, n, config.hidden_size, w.w, g.w, config.rms_norm_eps,
                             Ptr<T>(mix.p), Ptr<T>(dout), dsrc, w.g, g.g);
  }

  Param<T> embed_, out_res_w_, out_res_g_, final_norm_, head_;
  std::vector<Layer> layers_;
  std::vector<int64_t> kind_index_;  // per layer: its index among the KDA (or the MLA) layers
};

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

StatusOr<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, uint64_t seed,
                                               DType dtype) {
  if (static_cast<int64_t>(config.layers.size()) != config.num_layers) {
    return InvalidArgumentError("model config: layers has " + std::to_string(config.layers.size()) +
                                " entries, num_layers is " + std::to_string(config.num_layers));
  }
  if (dtype == DType::kF64 && config.kda.device == KdaDevice::kCuda &&
      config.num_kda_layers() > 0) {
    return InvalidArgumentError(
        "Model::Create: [model.kda] device = \"cuda\" needs an f32 model (the CUDA KDA kernels "
        "take f32 or bf16), got f64");
  }
  std::unique_ptr<Impl> impl;
  if (dtype == DType::kF32) {
    impl = std::make_unique<ModelImpl<float>>(config, seed);
  } else if (dtype == DType::kF64) {
    impl = std::make_unique<ModelImpl<double>>(config, seed);
  } else {
    return InvalidArgumentError("Model::Create: dtype must be f32 or f64, got " +
                                std::string(DTypeName(dtype)));
  }
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelConfig& Model::config() const { return impl_->config; }
DType Model::dtype() const { return impl_->dtype; }
std::vector<Parameter>& Model::parameters() { return impl_->params; }
const std::vector<Parameter>& Model::parameters() const { return impl_->params; }
std::vector<Tensor>& Model::balancing_biases() { return impl_->biases; }

Parameter* Model::FindParameter(const std::string& name) {
  for (Parameter& p : impl_->params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

StatusOr<Tensor> Model::Forward(const Batch& batch, ForwardCache* cache) {
  return impl_->Forward(batch, cache);
}
Status Model::Backward(const ForwardCache& cache, const Tensor& dlogits) {
  return impl_->Backward(cache, dlogits);
}
StatusOr<StepOutput> Model::Prefill(InferenceState* state, const std::vector<int64_t>& slots,
                                    const std::vector<std::vector<int32_t>>& prompts) {
  return impl_->Extend(state, slots, prompts);
}
StatusOr<StepOutput> Model::DecodeStep(InferenceState* state, const std::vector<int64_t>& slots,
                                       const std::vector<int32_t>& tokens) {
  std::vector<std::vector<int32_t>> segments;
  segments.reserve(tokens.size());
  for (int32_t t : tokens) segments.push_back({t});
  return impl_->Extend(state, slots, segments);
}
void Model::ZeroGrad() {
  for (Parameter& p : impl_->params) (void)p.grad.SetZero();
}

namespace {
std::string BiasName(const ModelConfig& c, size_t moe_index) {
  return "layers." + std::to_string(c.first_k_dense + static_cast<int64_t>(moe_index)) +
         ".moe.balancing_bias";
}
}  // namespace

Status Model::Save(const std::string& path) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Parameter& p : impl_->params) tensors.emplace_back(p.name, p.value);
  for (size_t i = 0; i < impl_->biases.size(); ++i) {
    tensors.emplace_back(BiasName(impl_->config, i), impl_->biases[i]);
  }
  return WriteSafetensors(path, tensors, {{"format", "orrery"}, {"model", impl_->config.name}});
}

Status Model::Load(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  auto load = [&](const std::string& name, Tensor& dst) -> Status {
    if (!file.Contains(name)) return NotFoundError(path + ": tensor '" + name + "' is missing");
    ORRERY_ASSIGN_OR_RETURN(Tensor t, file.Get(name));
    if (t.shape() != dst.shape() || t.dtype() != dst.dtype()) {
      return InvalidArgumentError(path + ": tensor '" + name + "' is " + t.ToString() +
                                  ", expected " + dst.ToString());
    }
    return dst.CopyFrom(t);
  };
  for (Parameter& p : impl_->params) ORRERY_RETURN_IF_ERROR(load(p.name, p.value));
  for (size_t i = 0; i < impl_->biases.size(); ++i) {
    ORRERY_RETURN_IF_ERROR(load(BiasName(impl_->config, i), impl_->biases[i]));
  }
  return Status::OK();
}

namespace {

// See BalancingMetrics::router_entropy. `scores`: [N, E] f32 tensors.
double MeanRouterEntropy(const std::vector<const Tensor*>& scores) {
  double sum = 0;
  int64_t rows = 0;
  for (const Tensor* t : scores) {
    const int64_t n = t->dim(0), e = t->dim(1);
    const float* s = t->data<float>();
    for (int64_t i = 0; i < n; ++i) {
      double z = 0;
      for (int64_t j = 0; j < e; ++j) z += s[i * e + j];
      if (z <= 0) continue;
      double h = 0;
      for (int64_t j = 0; j < e; ++j) {
        const double q = s[i * e + j] / z;
        if (q > 0) h -= q * std::log(q);
      }
      sum += h;
      ++rows;
    }
  }
  return rows > 0 ? sum / static_cast<double>(rows) : 0.0;
}

}  // namespace

Status Model::UpdateBalancingBiases(const std::vector<const ForwardCache*>& caches,
                                    BalancingMetrics* metrics, const RankGroup& group) {
  const ModelConfig& c = impl_->config;
  *metrics = BalancingMetrics();
  if (c.moe.balancing == Balancing::kNone || c.num_moe_layers() == 0) return Status::OK();
  for (size_t l = 0; l < impl_->biases.size(); ++l) {
    std::vector<const Tensor*> scores;
    for (const ForwardCache* fc : caches) {
      if (fc->router_scores().size() != impl_->biases.size()) {
        return InvalidArgumentError(
            "UpdateBalancingBiases: a cache holds no forward of this model");
      }
      scores.push_back(&fc->router_scores()[l]);
    }
    QuantileBalancingResult r;
    ORRERY_RETURN_IF_ERROR(QuantileBalancingStep(scores, c.moe, &impl_->biases[l], &r, group));
    metrics->load.push_back(r.load);
    metrics->max_violation_before.push_back(r.max_violation_before);
    metrics->max_violation_after.push_back(r.max_violation_after);
    metrics->bias_change.push_back(r.bias_change);
    metrics->router_entropy.push_back(MeanRouterEntropy(scores));
  }
  return Status::OK();
}

}  // namespace orrery::model
