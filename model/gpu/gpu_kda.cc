// The GPU model's KDA layer (spec §2.1), step for step the host KdaLayer (model/layers/kda.cc):
// q/k/v projections, short conv + SiLU per document, decay logits through the rank-r pair, beta
// logits, the chunked core (its input transforms apply the q/k L2 norm, the beta sigmoid and the
// gate, and it keeps its chunk intermediates for the backward), the per-head output RMSNorm, the
// sigmoid output gate (full rank, or K3's alternative D -> r -> H*V with a bias) and W_o.
#include "kernels/gates.h"
#include "kernels/phase_profile.h"
#include "kernels/rmsnorm.h"
#include "kernels/rows.h"
#include "kernels/short_conv.h"
#include "model/gpu/gpu_layers.h"

namespace orrery::model::gpu {

Status GpuKda::Init(const WeightTable& t, const ModelConfig& c, const std::string& p) {
  c_ = &c;
  h_ = c.kda.heads;
  kd_ = c.kda.head_k_dim;
  vd_ = c.kda.head_v_dim;
  const std::pair<Weight*, const char*> names[] = {
      {&wq_, ".wq"},       {&wk_, ".wk"},           {&wv_, ".wv"},     {&cq_, ".conv_q"},
      {&ck_, ".conv_k"},   {&cv_, ".conv_v"},       {&fa_, ".f_a"},    {&fb_, ".f_b"},
      {&a_log_, ".A_log"}, {&dt_bias_, ".dt_bias"}, {&wb_, ".w_beta"}, {&onorm_, ".o_norm"},
      {&wo_, ".wo"}};
  for (const auto& [w, name] : names) {
    ORRERY_ASSIGN_OR_RETURN(*w, t.Get(p + name));
  }
  if (c.kda.output_gate_rank > 0) {  // D -> r -> H*V with a bias (Kimi Linear)
    ORRERY_ASSIGN_OR_RETURN(wga_, t.Get(p + ".wg_a"));
    ORRERY_ASSIGN_OR_RETURN(wgb_, t.Get(p + ".wg_b"));
    ORRERY_ASSIGN_OR_RETURN(wgb_bias_, t.Get(p + ".wg_b_bias"));
    return Status::OK();
  }
  ORRERY_ASSIGN_OR_RETURN(wg_, t.Get(p + ".wg"));
  return Status::OK();
}

kernels::KdaOptions GpuKda::Options(bool training) const {
  kernels::KdaOptions o;
  o.algorithm =
      c_->kda.recurrent ? kernels::KdaAlgorithm::kRecurrent : kernels::KdaAlgorithm::kChunked;
  o.chunk_size = static_cast<int>(c_->kda.chunk_size);
  o.output_final_state = false;
  o.keep_for_backward = training;
  o.transforms.qk_l2norm = true;  // eps 1e-6, as KdaLayer::Gates
  o.transforms.beta_sigmoid = true;
  o.transforms.gate = true;
  o.transforms.gate_kind = c_->kda.gate == GateKind::kBounded ? kernels::KdaGateKind::kBounded
                                                              : kernels::KdaGateKind::kOriginal;
  o.transforms.gate_lower_bound = static_cast<float>(c_->kda.gate_lower_bound);
  return o;
}

kernels::KdaInputs GpuKda::Inputs(const Cache& c, const Sequences& s) const {
  kernels::KdaInputs in;
  in.q = c.qc.Reshape({1, s.n, h_, kd_}).value();
  in.k = c.kc.Reshape({1, s.n, h_, kd_}).value();
  in.v = c.v.Reshape({1, s.n, h_, vd_}).value();
  in.g = c.z.Reshape({1, s.n, h_, kd_}).value();
  in.beta = c.bl.Reshape({1, s.n, h_}).value();
  in.cu_seqlens = s.cu_host;
  in.a_log = a_log_.master;  // f32 either way: the transforms take the gate's parameters in f32
  in.dt_bias = dt_bias_.master;
  return in;
}

Status GpuKda::Forward(const Tensor& x, const Sequences& s, bool training, Tensor* y,
                       Cache* c) const {
  c->x = x;
  kernels::PhaseScope scope("fwd.kda");
  ORRERY_RETURN_IF_ERROR(Linear(x, wq_, &c->qh));
  ORRERY_RETURN_IF_ERROR(Linear(x, wk_, &c->kh));
  ORRERY_RETURN_IF_ERROR(Linear(x, wv_, &c->vh));
  ORRERY_RETURN_IF_ERROR(
      kernels::ShortConvSilu(c->qh, cq_.compute, s.cu_device, s.cu_host, &c->qc));
  ORRERY_RETURN_IF_ERROR(
      kernels::ShortConvSilu(c->kh, ck_.compute, s.cu_device, s.cu_host, &c->kc));
  ORRERY_RETURN_IF_ERROR(kernels::ShortConvSilu(c->vh, cv_.compute, s.cu_device, s.cu_host, &c->v));
  ORRERY_RETURN_IF_ERROR(Linear(x, fa_, &c->fa));
  ORRERY_RETURN_IF_ERROR(Linear(c->fa, fb_, &c->z));
  ORRERY_RETURN_IF_ERROR(Linear(x, wb_, &c->bl));
  kernels::KdaOutputs out;
  {
    kernels::PhaseScope core("fwd.kda.core");
    ORRERY_RETURN_IF_ERROR(kernels::KdaForward(Inputs(*c, s), Options(training), &out));
  }
  c->saved = out.saved;
  ORRERY_ASSIGN_OR_RETURN(c->o, out.o.Reshape({s.n * h_, vd_}));
  return Output(x, s.n, c, y);
}

Status GpuKda::Output(const Tensor& x, int64_t n, Cache* c, Tensor* y) const {
  ORRERY_RETURN_IF_ERROR(
      kernels::RmsNorm(c->o, onorm_.compute, c_->rms_norm_eps, &c->on, &c->o_rstd));
  ORRERY_ASSIGN_OR_RETURN(c->on, c->on.Reshape({n, h_ * vd_}));
  if (c_->kda.output_gate_rank > 0) {
    ORRERY_RETURN_IF_ERROR(Linear(x, wga_, &c->gate_low));
    ORRERY_RETURN_IF_ERROR(Linear(c->gate_low, wgb_, &c->gate));
    ORRERY_RETURN_IF_ERROR(kernels::AddRowBias(wgb_bias_.compute, &c->gate));
  } else {
    ORRERY_RETURN_IF_ERROR(Linear(x, wg_, &c->gate));
  }
  ORRERY_RETURN_IF_ERROR(kernels::SigmoidGate(c->on, c->gate, &c->og));
  return Linear(c->og, wo_, y);
}

Status GpuKda::Infer(const Tensor& x, const InferenceSegments& s, KdaSlotState* st,
                     Tensor* y) const {
  Cache c;
  ORRERY_RETURN_IF_ERROR(Linear(x, wq_, &c.qh));
  ORRERY_RETURN_IF_ERROR(Linear(x, wk_, &c.kh));
  ORRERY_RETURN_IF_ERROR(Linear(x, wv_, &c.vh));
  // Short conv + SiLU over each slot's window [history ; new rows]; the window's last
  // conv_size - 1 pre-conv rows become the slot's history (the host KdaLayer::Infer's window).
  const struct {
    const Tensor& pre;
    const Weight& conv;
    Tensor* out;
    Tensor* hist;
  } streams[3] = {{c.qh, cq_, &c.qc, &st->conv[0]},
                  {c.kh, ck_, &c.kc, &st->conv[1]},
                  {c.vh, cv_, &c.v, &st->conv[2]}};
  for (const auto& stream : streams) {
    if (!s.ext_index.defined()) {  // conv_size 1: no history
      ORRERY_RETURN_IF_ERROR(kernels::ShortConvSilu(stream.pre, stream.conv.compute, s.cu_device,
                                                    s.cu_host, stream.out));
      continue;
    }
    const int64_t hist_rows = stream.hist->dim(0), width = stream.pre.dim(1);
    ORRERY_ASSIGN_OR_RETURN(
        Tensor both, Tensor::Allocate({hist_rows + s.n, width}, stream.pre.dtype(), x.device()));
    ORRERY_ASSIGN_OR_RETURN(Tensor both_hist, both.Slice(0, hist_rows));
    ORRERY_ASSIGN_OR_RETURN(Tensor both_new, both.Slice(hist_rows, hist_rows + s.n));
    ORRERY_RETURN_IF_ERROR(both_hist.CopyFrom(*stream.hist));
    ORRERY_RETURN_IF_ERROR(both_new.CopyFrom(stream.pre));
    Tensor window, conv_out;
    ORRERY_RETURN_IF_ERROR(kernels::GatherRows(both, s.ext_index, &window));
    ORRERY_RETURN_IF_ERROR(
        kernels::ShortConvSilu(window, stream.conv.compute, s.ext_cu, s.ext_cu_host, &conv_out));
    ORRERY_RETURN_IF_ERROR(kernels::GatherRows(conv_out, s.new_rows, stream.out));
    ORRERY_RETURN_IF_ERROR(kernels::GatherRows(window, s.hist_rows, stream.hist));
  }
  ORRERY_RETURN_IF_ERROR(Linear(x, fa_, &c.fa));
  ORRERY_RETURN_IF_ERROR(Linear(c.fa, fb_, &c.z));
  ORRERY_RETURN_IF_ERROR(Linear(x, wb_, &c.bl));
  Sequences seq;
  seq.n = s.n;
  seq.cu_host = s.cu_host;
  kernels::KdaInputs in = Inputs(c, seq);
  in.initial_state = st->state;
  kernels::KdaOptions o = Options(false);
  o.output_final_state = true;
  kernels::KdaOutputs out;
  ORRERY_RETURN_IF_ERROR(kernels::KdaForward(in, o, &out));
  st->state = out.final_state;
  ORRERY_ASSIGN_OR_RETURN(c.o, out.o.Reshape({s.n * h_, vd_}));
  return Output(x, s.n, &c, y);
}

Status GpuKda::Decode(const Tensor& x, const KdaStateRows& st, Tensor* y) const {
  const int64_t n = x.dim(0);
  Cache c;
  ORRERY_RETURN_IF_ERROR(Linear(x, wq_, &c.qh));
  ORRERY_RETURN_IF_ERROR(Linear(x, wk_, &c.kh));
  ORRERY_RETURN_IF_ERROR(Linear(x, wv_, &c.vh));
  Tensor no_history;
  const struct {
    const Tensor& pre;
    const Weight& conv;
    Tensor* out;
    Tensor* hist;
  } streams[3] = {{c.qh, cq_, &c.qc, st.conv[0]},
                  {c.kh, ck_, &c.kc, st.conv[1]},
                  {c.vh, cv_, &c.v, st.conv[2]}};
  for (const auto& stream : streams) {
    ORRERY_RETURN_IF_ERROR(kernels::ShortConvSiluDecode(
        stream.pre, stream.conv.compute, st.rows,
        stream.hist != nullptr ? stream.hist : &no_history, stream.out));
  }
  ORRERY_RETURN_IF_ERROR(Linear(x, fa_, &c.fa));
  ORRERY_RETURN_IF_ERROR(Linear(c.fa, fb_, &c.z));
  ORRERY_RETURN_IF_ERROR(Linear(x, wb_, &c.bl));
  kernels::KdaDecodeOptions o;
  o.transforms = Options(false).transforms;
  o.a_log = a_log_.master;  // f32 either way, as the forward's transforms take them
  o.dt_bias = dt_bias_.master;
  o.rows = st.rows;
  ORRERY_ASSIGN_OR_RETURN(Tensor q, c.qc.Reshape({n, h_, kd_}));
  ORRERY_ASSIGN_OR_RETURN(Tensor k, c.kc.Reshape({n, h_, kd_}));
  ORRERY_ASSIGN_OR_RETURN(Tensor v, c.v.Reshape({n, h_, vd_}));
  ORRERY_ASSIGN_OR_RETURN(Tensor g, c.z.Reshape({n, h_, kd_}));
  ORRERY_ASSIGN_OR_RETURN(Tensor beta, c.bl.Reshape({n, h_}));
  Tensor o_rows;
  ORRERY_RETURN_IF_ERROR(kernels::KdaDecodeStep(q, k, v, g, beta, o, st.state, &o_rows));
  ORRERY_ASSIGN_OR_RETURN(c.o, o_rows.Reshape({n * h_, vd_}));
  return Output(x, n, &c, y);
}

Status GpuKda::Backward(const Cache& c, const Sequences& s, const Tensor& dy, Tensor* dx) const {
  kernels::PhaseScope scope("bwd.kda");
  Tensor dog, don, dgate;
  ORRERY_RETURN_IF_ERROR(LinearGradChain(c.og, wo_, dy, &dog));
  ORRERY_RETURN_IF_ERROR(kernels::SigmoidGateGrad(c.on, c.gate, dog, &don, &dgate));
  if (c_->kda.output_gate_rank > 0) {
    Tensor bias_grad = wgb_bias_.grad, dlow;
    ORRERY_RETURN_IF_ERROR(kernels::RowBiasGrad(dgate, &bias_grad));
    ORRERY_RETURN_IF_ERROR(LinearGradChain(c.gate_low, wgb_, dgate, &dlow));
    ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, wga_, dlow, dx));
  } else {
    ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, wg_, dgate, dx));
  }
  Tensor d_o;
  ORRERY_ASSIGN_OR_RETURN(Tensor don_rows, don.Reshape({s.n * h_, vd_}));
  Tensor onorm_grad = onorm_.grad;
  ORRERY_RETURN_IF_ERROR(
      kernels::RmsNormGrad(c.o, onorm_.compute, c.o_rstd, don_rows, &d_o, &onorm_grad));
  ORRERY_ASSIGN_OR_RETURN(d_o, d_o.Reshape({1, s.n, h_, vd_}));
  kernels::KdaGrads g;
  {
    kernels::PhaseScope core("bwd.kda.core");
    ORRERY_RETURN_IF_ERROR(
        kernels::KdaBackward(Inputs(c, s), d_o, Tensor(), Options(true), &g, c.saved.get()));
  }
  Tensor da_log = a_log_.grad, ddt = dt_bias_.grad;
  ORRERY_RETURN_IF_ERROR(Accumulate(g.da_log, &da_log));
  ORRERY_ASSIGN_OR_RETURN(Tensor ddt_src, g.ddt_bias.Reshape(ddt.shape()));
  ORRERY_RETURN_IF_ERROR(Accumulate(ddt_src, &ddt));
  // beta logits, decay logits.
  ORRERY_ASSIGN_OR_RETURN(Tensor dbl, g.dbeta.Reshape({s.n, h_}));
  ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, wb_, dbl, dx));
  ORRERY_ASSIGN_OR_RETURN(Tensor dz, g.dg.Reshape({s.n, h_ * kd_}));
  ORRERY_ASSIGN_OR_RETURN(dz, As(dz, c.fa.dtype()));
  Tensor dfa;
  ORRERY_RETURN_IF_ERROR(LinearGradChain(c.fa, fb_, dz, &dfa));
  ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, fa_, dfa, dx));
  // conv + SiLU, then the projections.
  struct Stream {
    const Tensor& pre;
    const Weight& conv;
    const Weight& proj;
    const Tensor& dy;
    int64_t width;
  };
  const Stream streams[3] = {{c.qh, cq_, wq_, g.dq, h_ * kd_},
                             {c.kh, ck_, wk_, g.dk, h_ * kd_},
                             {c.vh, cv_, wv_, g.dv, h_ * vd_}};
  for (const Stream& st : streams) {
    ORRERY_ASSIGN_OR_RETURN(Tensor dyc, st.dy.Reshape({s.n, st.width}));
    Tensor dpre, conv_grad = st.conv.grad;
    ORRERY_RETURN_IF_ERROR(kernels::ShortConvSiluGrad(st.pre, st.conv.compute, s.cu_device,
                                                      s.cu_host, dyc, &dpre, &conv_grad));
    ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, st.proj, dpre, dx));
  }
  return Status::OK();
}

}  // namespace orrery::model::gpu
