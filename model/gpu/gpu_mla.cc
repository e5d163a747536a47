// The GPU model's gated MLA layer (spec §3), step for step the host MlaLayer (model/layers/mla.cc):
// queries (through the q LoRA and its RMSNorm when configured), the latent c and the shared rope
// key from the two row blocks of W_kva, the latent RMSNorm, W_kvb to per-head k_nope and v, causal
// attention per document, the sigmoid output gate and W_o.
#include <cmath>

#include "kernels/attention.h"
#include "kernels/gates.h"
#include "kernels/matmul.h"
#include "kernels/mla_decode.h"
#include "kernels/mla_keys.h"
#include "kernels/phase_profile.h"
#include "kernels/rmsnorm.h"
#include "kernels/rows.h"
#include "model/gpu/gpu_layers.h"

namespace orrery::model::gpu {

Status GpuMla::Init(const WeightTable& t, const ModelConfig& c, const std::string& p) {
  c_ = &c;
  h_ = c.mla.heads;
  dn_ = c.mla.qk_nope_head_dim;
  dv_ = c.mla.v_head_dim;
  dqk_ = c.mla_qk_head_dim();
  scale_ = 1.0 / std::sqrt(static_cast<double>(dqk_));
  if (c.mla.q_lora_rank > 0) {
    ORRERY_ASSIGN_OR_RETURN(wqa_, t.Get(p + ".wq_a"));
    ORRERY_ASSIGN_OR_RETURN(qnorm_, t.Get(p + ".q_a_norm"));
    ORRERY_ASSIGN_OR_RETURN(wqb_, t.Get(p + ".wq_b"));
  } else {
    ORRERY_ASSIGN_OR_RETURN(wq_, t.Get(p + ".wq"));
  }
  ORRERY_ASSIGN_OR_RETURN(Weight wkva, t.Get(p + ".wkv_a"));
  const int64_t dc = c.mla.kv_lora_rank, dr = c.mla.qk_rope_head_dim;
  ORRERY_ASSIGN_OR_RETURN(wc_, wkva.Rows(0, dc));
  ORRERY_ASSIGN_OR_RETURN(wr_, wkva.Rows(dc, dc + dr));
  ORRERY_ASSIGN_OR_RETURN(kvnorm_, t.Get(p + ".kv_a_norm"));
  ORRERY_ASSIGN_OR_RETURN(wkvb_, t.Get(p + ".wkv_b"));
  if (c.mla.output_gate) {
    ORRERY_ASSIGN_OR_RETURN(wg_, t.Get(p + ".wg"));
  }
  ORRERY_ASSIGN_OR_RETURN(wo_, t.Get(p + ".wo"));
  return Status::OK();
}

Status GpuMla::Queries(const Tensor& x, Cache* c) const {
  if (c_->mla.q_lora_rank > 0) {
    ORRERY_RETURN_IF_ERROR(Linear(x, wqa_, &c->qa));
    ORRERY_RETURN_IF_ERROR(
        kernels::RmsNorm(c->qa, qnorm_.compute, c_->mla.lora_eps, &c->qan, &c->qa_rstd));
    return Linear(c->qan, wqb_, &c->q);
  }
  return Linear(x, wq_, &c->q);
}

Status GpuMla::Project(const Tensor& x, Cache* c, Tensor* kr) const {
  ORRERY_RETURN_IF_ERROR(Queries(x, c));
  ORRERY_RETURN_IF_ERROR(Linear(x, wc_, &c->cl));
  ORRERY_RETURN_IF_ERROR(Linear(x, wr_, kr));
  return kernels::RmsNorm(c->cl, kvnorm_.compute, c_->mla.lora_eps, &c->chat, &c->c_rstd);
}

Status GpuMla::Output(const Tensor& x, const Tensor& o, Cache* c, Tensor* y) const {
  if (!c_->mla.output_gate) return Linear(o, wo_, y);
  ORRERY_RETURN_IF_ERROR(Linear(x, wg_, &c->gl));
  ORRERY_RETURN_IF_ERROR(kernels::SigmoidGate(o, c->gl, &c->og));
  return Linear(c->og, wo_, y);
}

Status GpuMla::Forward(const Tensor& x, const Sequences& s, Tensor* y, Cache* c) const {
  c->x = x;
  kernels::PhaseScope scope("fwd.mla");
  const int64_t n = s.n;
  Tensor kr;
  ORRERY_RETURN_IF_ERROR(Project(x, c, &kr));
  ORRERY_RETURN_IF_ERROR(Linear(c->chat, wkvb_, &c->kv));
  ORRERY_ASSIGN_OR_RETURN(Tensor kv3, c->kv.Reshape({n, h_, dn_ + dv_}));
  ORRERY_RETURN_IF_ERROR(kernels::MlaKeysValues(kv3, kr, dn_, &c->k, &c->v));
  ORRERY_ASSIGN_OR_RETURN(Tensor q3, c->q.Reshape({n, h_, dqk_}));
  {
    kernels::PhaseScope attn("fwd.mla.attention");
    ORRERY_RETURN_IF_ERROR(
        kernels::CausalAttention(q3, c->k, c->v, s.cu_device, scale_, &c->o, &c->lse));
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor o2, c->o.Reshape({n, h_ * dv_}));
  return Output(x, o2, c, y);
}

Status GpuMla::QueriesAndLatents(const Tensor& x, const MlaPagedCall& call, Tensor* pages, Cache* c,
                                 Tensor* latents) const {
  const int64_t dc = c_->mla.kv_lora_rank, dr = c_->mla.qk_rope_head_dim;
  Tensor kr;
  ORRERY_RETURN_IF_ERROR(Project(x, c, &kr));
  ORRERY_ASSIGN_OR_RETURN(*latents, Tensor::Allocate({x.dim(0), dc + dr}, x.dtype(), x.device()));
  ORRERY_RETURN_IF_ERROR(kernels::CopyColumns(c->chat, 0, dc, latents, 0));
  ORRERY_RETURN_IF_ERROR(kernels::CopyColumns(kr, 0, dr, latents, dc));
  return kernels::PagedLatentWrite(*latents, call.slot_mapping, pages);
}

Status GpuMla::Infer(const Tensor& x, const InferenceSegments& s, const MlaPagedCall& call,
                     Tensor* pages, Tensor* y) const {
  const int64_t n = s.n, dc = c_->mla.kv_lora_rank, dr = c_->mla.qk_rope_head_dim, w = dc + dr;
  const DType dt = x.dtype();
  const Device dev = x.device();
  Cache c;
  Tensor latents;
  ORRERY_RETURN_IF_ERROR(QueriesAndLatents(x, call, pages, &c, &latents));
  Tensor qa;
  ORRERY_RETURN_IF_ERROR(AbsorbQueries(c.q, &qa));
  // Attention over each slot's pages: the latent output ol [n, H, dc].
  Tensor ol;
  if (!call.uniform) {
    ORRERY_ASSIGN_OR_RETURN(ol, Tensor::Allocate({n, h_ * dc}, dt, dev));
  }
  const int64_t segments = static_cast<int64_t>(s.cu.size()) - 1;
  const int64_t calls = call.uniform ? 1 : segments;
  for (int64_t i = 0; i < calls; ++i) {
    const int64_t b = call.uniform ? 0 : s.cu[i], e = call.uniform ? n : s.cu[i + 1];
    const int64_t seqs = call.uniform ? segments : 1, q_len = (e - b) / seqs;
    kernels::PagedLatentCache cache;
    cache.pages = *pages;
    if (call.uniform) {
      cache.block_table = call.block_table;
      cache.context_lens = call.context_lens;
    } else {
      ORRERY_ASSIGN_OR_RETURN(cache.block_table, call.block_table.Slice(i, i + 1));
      ORRERY_ASSIGN_OR_RETURN(cache.context_lens, call.context_lens.Slice(i, i + 1));
    }
    ORRERY_ASSIGN_OR_RETURN(Tensor q4, qa.Slice(b, e));
    ORRERY_ASSIGN_OR_RETURN(q4, q4.Reshape({seqs, q_len, h_, w}));
    Tensor o, lse;
    ORRERY_RETURN_IF_ERROR(
        kernels::MlaDecodePaged(q4, cache, dc, static_cast<float>(scale_), &o, &lse));
    ORRERY_ASSIGN_OR_RETURN(o, o.Reshape({e - b, h_ * dc}));
    if (call.uniform) {
      ol = o;  // one call over every row: its output is ol
      break;
    }
    ORRERY_ASSIGN_OR_RETURN(Tensor dst, ol.Slice(b, e));
    ORRERY_RETURN_IF_ERROR(dst.CopyFrom(o));
  }
  Tensor o2;
  ORRERY_RETURN_IF_ERROR(AbsorbOutput(ol, &o2));
  return Output(x, o2, &c, y);
}

// W_UK,h is rows h*(dn+dv) .. h*(dn+dv)+dn of W_kvb [H*(dn+dv), dc], W_UV,h the next dv rows:
// every head's product is one strided-batched matmul over those row blocks.
Status GpuMla::AbsorbQueries(const Tensor& q, Tensor* qa) const {
  const int64_t n = q.dim(0), dc = c_->mla.kv_lora_rank, dr = c_->mla.qk_rope_head_dim;
  const int64_t w = dc + dr;
  ORRERY_ASSIGN_OR_RETURN(*qa, Tensor::Allocate({n, h_ * w}, q.dtype(), q.device()));
  const kernels::MatrixBatch qn{q, 0, n, dn_, h_ * dqk_, dqk_};
  const kernels::MatrixBatch uk{wkvb_.compute, 0, dn_, dc, dc, (dn_ + dv_) * dc};
  const kernels::MatrixBatch out{*qa, 0, n, dc, h_ * w, w};
  ORRERY_RETURN_IF_ERROR(kernels::MatmulStridedBatched(qn, uk, h_, kernels::MatmulOptions{}, out));
  // q^R_h behind each head's absorbed part: one column copy over the [n * H] head rows.
  ORRERY_ASSIGN_OR_RETURN(Tensor q_rows, q.Reshape({n * h_, dqk_}));
  ORRERY_ASSIGN_OR_RETURN(Tensor qa_rows, qa->Reshape({n * h_, w}));
  return kernels::CopyColumns(q_rows, dn_, dr, &qa_rows, dc);
}

Status GpuMla::AbsorbOutput(const Tensor& ol, Tensor* o2) const {
  const int64_t n = ol.dim(0), dc = c_->mla.kv_lora_rank;
  ORRERY_ASSIGN_OR_RETURN(*o2, Tensor::Allocate({n, h_ * dv_}, ol.dtype(), ol.device()));
  const kernels::MatrixBatch olh{ol, 0, n, dc, h_ * dc, dc};
  const kernels::MatrixBatch uv{wkvb_.compute, dn_ * dc, dv_, dc, dc, (dn_ + dv_) * dc};
  const kernels::MatrixBatch out{*o2, 0, n, dv_, h_ * dv_, dv_};
  kernels::MatmulOptions nt;
  nt.trans_b = true;
  return kernels::MatmulStridedBatched(olh, uv, h_, nt, out);
}

Status GpuMla::Backward(const Cache& c, const Sequences& s, const Tensor& dy, Tensor* dx) const {
  kernels::PhaseScope scope("bwd.mla");
  const int64_t n = s.n;
  ORRERY_ASSIGN_OR_RETURN(Tensor o2, c.o.Reshape({n, h_ * dv_}));
  Tensor dattn;
  if (c_->mla.output_gate) {
    Tensor dog, dgl;
    ORRERY_RETURN_IF_ERROR(LinearGradChain(c.og, wo_, dy, &dog));
    ORRERY_RETURN_IF_ERROR(kernels::SigmoidGateGrad(o2, c.gl, dog, &dattn, &dgl));
    ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, wg_, dgl, dx));
  } else {
    ORRERY_RETURN_IF_ERROR(LinearGradChain(o2, wo_, dy, &dattn));
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor d_o, dattn.Reshape({n, h_, dv_}));
  ORRERY_ASSIGN_OR_RETURN(Tensor q3, c.q.Reshape({n, h_, dqk_}));
  Tensor dq, dk, dv;
  {
    kernels::PhaseScope attn("bwd.mla.attention");
    ORRERY_RETURN_IF_ERROR(kernels::CausalAttentionGrad(q3, c.k, c.v, c.o, c.lse, d_o, s.cu_device,
                                                        scale_, &dq, &dk, &dv));
  }
  Tensor dkv, dkr;
  ORRERY_RETURN_IF_ERROR(kernels::MlaKeysValuesGrad(dk, dv, dn_, &dkv, &dkr));
  ORRERY_ASSIGN_OR_RETURN(dkv, dkv.Reshape({n, h_ * (dn_ + dv_)}));
  Tensor dchat, dcl;
  ORRERY_RETURN_IF_ERROR(LinearGradChain(c.chat, wkvb_, dkv, &dchat));
  Tensor kvnorm_grad = kvnorm_.grad;
  ORRERY_RETURN_IF_ERROR(
      kernels::RmsNormGrad(c.cl, kvnorm_.compute, c.c_rstd, dchat, &dcl, &kvnorm_grad));
  ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, wc_, dcl, dx));
  ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, wr_, dkr, dx));
  ORRERY_ASSIGN_OR_RETURN(Tensor dq2, dq.Reshape({n, h_ * dqk_}));
  if (c_->mla.q_lora_rank == 0) return LinearGrad(c.x, wq_, dq2, dx);
  Tensor dqan, dqa, qnorm_grad = qnorm_.grad;
  ORRERY_RETURN_IF_ERROR(LinearGradChain(c.qan, wqb_, dq2, &dqan));
  ORRERY_RETURN_IF_ERROR(
      kernels::RmsNormGrad(c.qa, qnorm_.compute, c.qa_rstd, dqan, &dqa, &qnorm_grad));
  return LinearGrad(c.x, wqa_, dqa, dx);
}

Status GpuMla::Decompress(const Tensor& latents, Tensor* k, Tensor* v) const {
  const int64_t m = latents.dim(0), dc = c_->mla.kv_lora_rank, dr = c_->mla.qk_rope_head_dim;
  ORRERY_ASSIGN_OR_RETURN(Tensor chat,
                          Tensor::Allocate({m, dc}, latents.dtype(), latents.device()));
  ORRERY_ASSIGN_OR_RETURN(Tensor kr, Tensor::Allocate({m, dr}, latents.dtype(), latents.device()));
  ORRERY_RETURN_IF_ERROR(kernels::CopyColumns(latents, 0, dc, &chat, 0));
  ORRERY_RETURN_IF_ERROR(kernels::CopyColumns(latents, dc, dr, &kr, 0));
  Tensor kv;
  ORRERY_RETURN_IF_ERROR(Linear(chat, wkvb_, &kv));
  ORRERY_ASSIGN_OR_RETURN(Tensor kv3, kv.Reshape({m, h_, dn_ + dv_}));
  return kernels::MlaKeysValues(kv3, kr, dn_, k, v);
}

Status GpuMla::InferMha(const Tensor& x, const InferenceSegments& s, const MlaPagedCall& call,
                        const MlaMhaCall& mha, MlaContextKv* kv, Tensor* pages, Tensor* y) const {
  kernels::PhaseScope scope("infer.mla.mha");
  const int64_t n = s.n;
  const DType dt = x.dtype();
  const Device dev = x.device();
  Cache c;
  Tensor latents;
  ORRERY_RETURN_IF_ERROR(QueriesAndLatents(x, call, pages, &c, &latents));
  // Their keys and values after the slots' earlier ones.
  Tensor k, v;
  ORRERY_RETURN_IF_ERROR(Decompress(latents, &k, &v));
  ORRERY_RETURN_IF_ERROR(kernels::ScatterRows(k, mha.rows, &kv->k));
  ORRERY_RETURN_IF_ERROR(kernels::ScatterRows(v, mha.rows, &kv->v));
  // Each segment's queries against its slot's keys: rows begin .. begin + keys - 1.
  ORRERY_ASSIGN_OR_RETURN(Tensor q3, c.q.Reshape({n, h_, dqk_}));
  ORRERY_ASSIGN_OR_RETURN(Tensor o, Tensor::Allocate({n, h_, dv_}, dt, dev));
  {
    kernels::PhaseScope attn("infer.mla.mha.attention");
    for (size_t i = 0; i + 1 < s.cu.size(); ++i) {
      const int64_t b = mha.begin[i], e = b + mha.keys[i];
      ORRERY_ASSIGN_OR_RETURN(Tensor qi, q3.Slice(s.cu[i], s.cu[i + 1]));
      ORRERY_ASSIGN_OR_RETURN(Tensor oi, o.Slice(s.cu[i], s.cu[i + 1]));
      ORRERY_ASSIGN_OR_RETURN(Tensor ki, kv->k.Slice(b, e));
      ORRERY_ASSIGN_OR_RETURN(Tensor vi, kv->v.Slice(b, e));
      Tensor lse;
      ORRERY_RETURN_IF_ERROR(
          kernels::PrefixCausalAttention(qi, ki, vi, mha.cu_q[i], mha.cu_k[i], scale_, &oi, &lse));
    }
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor o2, o.Reshape({n, h_ * dv_}));
  return Output(x, o2, &c, y);
}

}  // namespace orrery::model::gpu
