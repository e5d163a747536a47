#include "model/ops_run.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <utility>

#include "core/safetensors.h"
#include "kernels/attention.h"
#include "kernels/attn_res.h"
#include "kernels/embedding.h"
#include "kernels/gates.h"
#include "kernels/grouped_gemm.h"
#include "kernels/kda.h"
#include "kernels/lm_head_loss.h"
#include "kernels/matmul.h"
#include "kernels/mla_decode.h"
#include "kernels/mla_keys.h"
#include "kernels/rmsnorm.h"
#include "kernels/short_conv.h"
#include "kernels/situ.h"
#include "model/gpu/gpu_layers.h"
#include "model/layers.h"

namespace orrery::model {
namespace {

bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}

// The input file, the attributes and the outputs of one op run. Every tensor and attribute must be
// read by the op (Finish reports the others); float inputs are converted to one compute dtype.
class OpIo {
 public:
  OpIo(SafetensorsFile file, const OpRunOptions& options)
      : file_(std::move(file)), options_(options) {
    for (const std::string& name : file_.names()) {
      StatusOr<Tensor> t = file_.Get(name);
      if (t.ok() && t->dtype() == DType::kF64) compute_ = DType::kF64;
    }
  }

  DType compute() const { return compute_; }
  // Whether the input file holds `name` as bf16 (before any widening).
  bool StoredAsBf16(const std::string& name) const {
    StatusOr<Tensor> t = file_.Get(name);
    return t.ok() && t->dtype() == DType::kBF16;
  }
  bool backward() const { return options_.backward; }

  Status Error(const std::string& what) const {
    return InvalidArgumentError(options_.in_path + ": " + what);
  }

  // A float tensor in the compute dtype; `ndim` > 0 checks the rank (`layout` names the dims).
  StatusOr<Tensor> Float(const std::string& name, int ndim, const std::string& layout) {
    ORRERY_ASSIGN_OR_RETURN(Tensor t, Optional(name, ndim, layout));
    if (!t.defined()) {
      return Error("tensor '" + name + "' " + layout + " is missing (op " + options_.op + ")");
    }
    return t;
  }
  // As Float, but an absent tensor gives an undefined one.
  StatusOr<Tensor> Optional(const std::string& name, int ndim, const std::string& layout) {
    if (!file_.Contains(name)) return Tensor();
    read_.insert(name);
    ORRERY_ASSIGN_OR_RETURN(Tensor t, file_.Get(name));
    if (!IsFloat(t.dtype())) {
      return Error("tensor '" + name + "' is " + t.ToString() + ", expected a float tensor " +
                   layout + " (f32, f64, bf16 or f16)");
    }
    if ((t.dtype() == DType::kF64) != (compute_ == DType::kF64)) {
      return Error("tensor '" + name + "' is " + t.ToString() +
                   ", but other inputs are f64: give every float input as f64, or none");
    }
    if (ndim > 0 && t.ndim() != ndim) {
      return Error("tensor '" + name + "' is " + t.ToString() + ", expected " + layout);
    }
    if (t.dtype() == compute_) return t.Clone();
    return t.Cast(compute_);
  }
  // An integer tensor [n] converted to `dtype` (i32 or i64); undefined when absent.
  StatusOr<Tensor> Index(const std::string& name, DType dtype, const std::string& layout) {
    if (!file_.Contains(name)) return Tensor();
    read_.insert(name);
    ORRERY_ASSIGN_OR_RETURN(Tensor t, file_.Get(name));
    if (t.dtype() != DType::kI32 && t.dtype() != DType::kI64) {
      return Error("tensor '" + name + "' is " + t.ToString() + ", expected integers " + layout);
    }
    if (t.dtype() == dtype) return t.Clone();
    Tensor out = Tensor::Empty(t.shape(), dtype);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int64_t v = t.dtype() == DType::kI32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
      if (dtype == DType::kI32) {
        out.data<int32_t>()[i] = static_cast<int32_t>(v);
      } else {
        out.data<int64_t>()[i] = v;
      }
    }
    return out;
  }
  Status ExpectShape(const std::string& name, const Tensor& t, const Shape& shape,
                     const std::string& why) const {
    if (t.shape() == shape) return Status::OK();
    return Error("tensor '" + name + "' has shape " + ShapeToString(t.shape()) + ", expected " +
                 ShapeToString(shape) + " (" + why + ")");
  }

  StatusOr<double> Attr(const std::string& key, double def) {
    attrs_read_.insert(key);
    auto it = options_.attrs.find(key);
    if (it == options_.attrs.end()) return def;
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0') {
      return InvalidArgumentError("--attr " + key + "=" + it->second + ": expected a number");
    }
    return v;
  }
  StatusOr<std::string> AttrString(const std::string& key, const std::string& def) {
    attrs_read_.insert(key);
    auto it = options_.attrs.find(key);
    return it == options_.attrs.end() ? def : it->second;
  }

  void Out(const std::string& name, const Tensor& t) { outputs_.emplace_back(name, t); }

  // Unread tensors or attributes are errors (a misspelt name never silently falls back).
  Status Finish() const {
    for (const std::string& name : file_.names()) {
      if (!read_.count(name)) {
        std::string known;
        for (const std::string& r : read_) known += (known.empty() ? "" : ", ") + r;
        return Error("unexpected tensor '" + name + "' for op " + options_.op +
                     (options_.backward ? " --backward" : "") + " (it read: " + known + ")");
      }
    }
    for (const auto& [key, value] : options_.attrs) {
      if (!attrs_read_.count(key)) {
        return InvalidArgumentError("--attr " + key + "=" + value + ": op " + options_.op +
                                    " has no attribute '" + key + "' (see docs/ops.md)");
      }
    }
    return Status::OK();
  }

  Status Write() const {
    return WriteSafetensors(options_.out_path, outputs_,
                            {{"format", "orrery-ops"}, {"op", options_.op}});
  }

 private:
  SafetensorsFile file_;
  const OpRunOptions& options_;
  DType compute_ = DType::kF32;
  std::set<std::string> read_, attrs_read_;
  std::vector<std::pair<std::string, Tensor>> outputs_;
};

// ---- kda, kda_recurrent ----
Status RunKda(OpIo& io, const OpRunOptions& options, bool recurrent) {
  const std::string qk = "[B, T, H, K]";
  kernels::KdaInputs in;
  ORRERY_ASSIGN_OR_RETURN(in.q, io.Float("q", 4, qk));
  ORRERY_ASSIGN_OR_RETURN(in.k, io.Float("k", 4, qk));
  ORRERY_ASSIGN_OR_RETURN(in.v, io.Float("v", 4, "[B, T, H, V]"));
  ORRERY_ASSIGN_OR_RETURN(in.g, io.Float("g", 4, qk));
  ORRERY_ASSIGN_OR_RETURN(in.beta, io.Float("beta", 3, "[B, T, H]"));
  ORRERY_ASSIGN_OR_RETURN(in.initial_state, io.Optional("initial_state", 4, "[N, H, K, V]"));
  if (in.initial_state.defined() && io.compute() == DType::kF32) {
    // Widened inputs compute in f32; the state is f32 whatever it was given as.
    ORRERY_ASSIGN_OR_RETURN(in.initial_state, in.initial_state.Cast(DType::kF32));
  }
  ORRERY_ASSIGN_OR_RETURN(in.cu_seqlens, io.Index("cu_seqlens", DType::kI64, "[N + 1]"));
  kernels::KdaOptions opt;
  opt.algorithm = recurrent ? kernels::KdaAlgorithm::kRecurrent : kernels::KdaAlgorithm::kChunked;
  if (!recurrent) {
    ORRERY_ASSIGN_OR_RETURN(double chunk, io.Attr("chunk_size", 64));
    opt.chunk_size = static_cast<int>(chunk);
  }
  ORRERY_ASSIGN_OR_RETURN(double scale, io.Attr("scale", 0.0));
  opt.scale = static_cast<float>(scale);
  opt.output_final_state = true;
  // The op's input transforms (fla's use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
  // use_gate_in_kernel with A_log, dt_bias and lower_bound).
  kernels::KdaInputTransforms& tr = opt.transforms;
  ORRERY_ASSIGN_OR_RETURN(double l2, io.Attr("use_qk_l2norm", 0));
  ORRERY_ASSIGN_OR_RETURN(double beta_sigmoid, io.Attr("use_beta_sigmoid", 0));
  ORRERY_ASSIGN_OR_RETURN(double gate, io.Attr("use_gate", 0));
  ORRERY_ASSIGN_OR_RETURN(std::string gate_kind, io.AttrString("gate", "bounded"));
  ORRERY_ASSIGN_OR_RETURN(double lower_bound, io.Attr("lower_bound", -5.0));
  tr.qk_l2norm = l2 != 0;
  tr.beta_sigmoid = beta_sigmoid != 0;
  tr.gate = gate != 0;
  tr.gate_lower_bound = static_cast<float>(lower_bound);
  if (gate_kind != "bounded" && gate_kind != "original") {
    return InvalidArgumentError("--attr gate=" + gate_kind + ": expected bounded or original");
  }
  tr.gate_kind =
      gate_kind == "bounded" ? kernels::KdaGateKind::kBounded : kernels::KdaGateKind::kOriginal;
  if (tr.gate) {
    ORRERY_ASSIGN_OR_RETURN(in.a_log, io.Optional("A_log", 1, "[H]"));
    ORRERY_ASSIGN_OR_RETURN(in.dt_bias, io.Optional("dt_bias", 1, "[H * K]"));
  }
  Tensor d_o, d_final;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(d_o, io.Float("do", 4, "[B, T, H, V]"));
    ORRERY_ASSIGN_OR_RETURN(d_final, io.Optional("dfinal_state", 4, "[N, H, K, V]"));
    if (d_final.defined() && io.compute() == DType::kF32) {
      ORRERY_ASSIGN_OR_RETURN(d_final, d_final.Cast(DType::kF32));
    }
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(Device device, ParseDevice(options.device));
  kernels::KdaInputs run = in;
  // bf16 q, k, v, beta (and do) stay bf16 on the GPU, so that the tensor-core kernels take them
  // (narrowing the widened values back is exact); g and the states stay f32.
  bool tensor_cores = device.is_cuda() && !recurrent;
  for (const char* name : {"q", "k", "v", "beta"}) tensor_cores &= io.StoredAsBf16(name);
  if (io.backward()) tensor_cores &= io.StoredAsBf16("do");
  if (tensor_cores) {
    for (Tensor* t : {&run.q, &run.k, &run.v, &run.beta, &d_o}) {
      if (t->defined()) {
        ORRERY_ASSIGN_OR_RETURN(*t, t->Cast(DType::kBF16));
      }
    }
  }
  if (device.is_cuda()) {
    for (Tensor* t : {&run.q, &run.k, &run.v, &run.g, &run.beta, &run.initial_state, &run.a_log,
                      &run.dt_bias}) {
      if (t->defined()) {
        ORRERY_ASSIGN_OR_RETURN(*t, t->To(device));
      }
    }
    if (d_o.defined()) {
      ORRERY_ASSIGN_OR_RETURN(d_o, d_o.To(device));
    }
    if (d_final.defined()) {
      ORRERY_ASSIGN_OR_RETURN(d_final, d_final.To(device));
    }
  }
  // Results come back as f32 (bf16 ones from the tensor-core path widen exactly).
  auto cpu = [](const Tensor& t) -> StatusOr<Tensor> {
    ORRERY_ASSIGN_OR_RETURN(Tensor c, t.To(Device::Cpu()));
    return c.dtype() == DType::kBF16 ? c.Cast(DType::kF32) : StatusOr<Tensor>(std::move(c));
  };
  kernels::KdaOutputs out;
  Status st = kernels::KdaForward(run, opt, &out);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_ASSIGN_OR_RETURN(Tensor o, cpu(out.o));
  ORRERY_ASSIGN_OR_RETURN(Tensor final_state, cpu(out.final_state));
  io.Out("o", o);
  io.Out("final_state", final_state);
  if (!io.backward()) return Status::OK();
  kernels::KdaGrads g;
  st = kernels::KdaBackward(run, d_o, d_final, opt, &g);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_ASSIGN_OR_RETURN(Tensor dq, cpu(g.dq));
  ORRERY_ASSIGN_OR_RETURN(Tensor dk, cpu(g.dk));
  io.Out("dq", dq);
  io.Out("dk", dk);
  ORRERY_ASSIGN_OR_RETURN(Tensor dv, cpu(g.dv));
  ORRERY_ASSIGN_OR_RETURN(Tensor dg, cpu(g.dg));
  ORRERY_ASSIGN_OR_RETURN(Tensor dbeta, cpu(g.dbeta));
  io.Out("dv", dv);
  io.Out("dg", dg);
  io.Out("dbeta", dbeta);
  if (g.dinitial_state.defined()) {
    ORRERY_ASSIGN_OR_RETURN(Tensor dh0, cpu(g.dinitial_state));
    io.Out("dinitial_state", dh0);
  }
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"dA_log", &g.da_log},
                                std::pair<const char*, const Tensor*>{"ddt_bias", &g.ddt_bias}}) {
    if (!t->defined()) continue;
    ORRERY_ASSIGN_OR_RETURN(Tensor host, cpu(*t));
    io.Out(name, host);
  }
  return Status::OK();
}

// Document offsets over B*T rows: cu_seqlens (then B must be 1) or one document per row.
StatusOr<std::vector<int64_t>> Documents(OpIo& io, const Tensor& cu, int64_t b, int64_t t) {
  std::vector<int64_t> out;
  if (!cu.defined()) {
    for (int64_t i = 0; i <= b; ++i) out.push_back(i * t);
    return out;
  }
  if (b != 1) return io.Error("cu_seqlens needs B = 1 (packed rows), got B = " + std::to_string(b));
  if (cu.ndim() != 1 || cu.numel() < 2) return io.Error("cu_seqlens: expected i64 [N + 1]");
  out.assign(cu.data<int64_t>(), cu.data<int64_t>() + cu.numel());
  if (out.front() != 0 || out.back() != t) {
    return io.Error("cu_seqlens must run from 0 to T = " + std::to_string(t));
  }
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i] <= out[i - 1]) return io.Error("cu_seqlens must be strictly increasing");
  }
  return out;
}

// ---- The ops on either device run the Tensor-level ops (kernels/*.h) on device copies of their
// ---- inputs, the outputs copied back. On the cpu they compute in the inputs' dtype (the ops' CPU
// twins); on cuda inputs stored as bf16 run in bf16 (the GPU model's activations), others in f32,
// f64 inputs are refused, and outputs come back as f32 (rounded from bf16 where computed in bf16).

Status RefuseF64OnCuda(OpIo& io) {
  if (io.compute() == DType::kF64) {
    return io.Error("f64 inputs run on the cpu only; give f32 or bf16 tensors for --device cuda");
  }
  return Status::OK();
}

// The dtype an op computes in on `device`, `lead` naming the input whose storage decides on cuda.
StatusOr<DType> ComputeDType(OpIo& io, Device device, const std::string& lead) {
  if (device.is_cpu()) return io.compute();
  ORRERY_RETURN_IF_ERROR(RefuseF64OnCuda(io));
  return io.StoredAsBf16(lead) ? DType::kBF16 : DType::kF32;
}

StatusOr<Tensor> Upload(const Tensor& t, DType dt, Device device) {
  if (!t.defined()) return Tensor();
  if (t.dtype() == dt) return t.To(device);
  ORRERY_ASSIGN_OR_RETURN(Tensor c, t.Cast(dt));
  return c.To(device);
}

// t back on the host as `shape`, bf16 widened to f32.
StatusOr<Tensor> Download(const Tensor& t, const Shape& shape) {
  ORRERY_ASSIGN_OR_RETURN(Tensor h, t.To(Device::Cpu()));
  if (h.dtype() == DType::kBF16) {
    ORRERY_ASSIGN_OR_RETURN(h, h.Cast(DType::kF32));
  }
  return h.Reshape(shape);
}

// Downloads t (see Download) as the op's output `name`.
Status Emit(OpIo& io, const std::string& name, const Tensor& t, const Shape& shape) {
  ORRERY_ASSIGN_OR_RETURN(Tensor h, Download(t, shape));
  io.Out(name, h);
  return Status::OK();
}

// Document offsets as the ops take them: i64 [docs + 1] on `device`.
StatusOr<Tensor> OffsetsOn(const std::vector<int64_t>& cu, Device device) {
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu).To(device);
}

// ---- mla: causal softmax attention with LSE (kernels/attention.h) ----
Status RunMla(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor q, io.Float("q", 4, "[B, T, H, Dqk]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor k, io.Float("k", 4, "[B, T, H, Dqk]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor v, io.Float("v", 4, "[B, T, H, Dv]"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("k", k, q.shape(), "as q"));
  const int64_t b = q.dim(0), t = q.dim(1), h = q.dim(2), dqk = q.dim(3), dv = v.dim(3);
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("v", v, {b, t, h, dv}, "[B, T, H, Dv] as q"));
  ORRERY_ASSIGN_OR_RETURN(Tensor cu_t, io.Index("cu_seqlens", DType::kI64, "[N + 1]"));
  ORRERY_ASSIGN_OR_RETURN(double scale, io.Attr("scale", 0.0));
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(dqk));
  Tensor d_o;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(d_o, io.Float("do", 4, "[B, T, H, Dv]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("do", d_o, v.shape(), "as v"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(std::vector<int64_t> cu, Documents(io, cu_t, b, t));
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "q"));
  ORRERY_ASSIGN_OR_RETURN(Tensor cug, OffsetsOn(cu, device));
  // The op's layout: the B * T tokens packed, [N, H, D].
  auto packed = [&](const Tensor& x) -> StatusOr<Tensor> {
    ORRERY_ASSIGN_OR_RETURN(Tensor r, x.Reshape({b * t, h, x.dim(3)}));
    return Upload(r, dt, device);
  };
  ORRERY_ASSIGN_OR_RETURN(Tensor qg, packed(q));
  ORRERY_ASSIGN_OR_RETURN(Tensor kg, packed(k));
  ORRERY_ASSIGN_OR_RETURN(Tensor vg, packed(v));
  Tensor o, lse;
  Status st = kernels::CausalAttention(qg, kg, vg, cug, scale, &o, &lse);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "o", o, v.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "lse", lse, {b, t, h}));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dog, packed(d_o));
  Tensor dq, dk, dvg;
  st = kernels::CausalAttentionGrad(qg, kg, vg, o, lse, dog, cug, scale, &dq, &dk, &dvg);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "dq", dq, q.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dk", dk, k.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dv", dvg, v.shape()));
  return Status::OK();
}

// ---- rmsnorm ----
// The inputs of rmsnorm, on either device.
struct RmsNormArgs {
  Tensor x, w, dy;  // dy with --backward
  double eps = 0;
  int64_t d = 0, rows = 0;
};

StatusOr<RmsNormArgs> ReadRmsNorm(OpIo& io) {
  RmsNormArgs r;
  ORRERY_ASSIGN_OR_RETURN(r.x, io.Float("x", 0, "[..., D]"));
  if (r.x.ndim() < 1) return io.Error("tensor 'x' must have at least one dimension [..., D]");
  r.d = r.x.dim(r.x.ndim() - 1);
  r.rows = r.x.numel() / std::max<int64_t>(r.d, 1);
  ORRERY_ASSIGN_OR_RETURN(r.w, io.Optional("w", 1, "[D]"));
  if (r.w.defined()) {
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("w", r.w, {r.d}, "[D], D = x's last dim"));
  }
  ORRERY_ASSIGN_OR_RETURN(r.eps, io.Attr("eps", 1e-5));
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(r.dy, io.Float("dy", 0, "as x"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dy", r.dy, r.x.shape(), "as x"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  return r;
}

template <typename T>
Status RunRmsNormTyped(OpIo& io) {
  ORRERY_ASSIGN_OR_RETURN(RmsNormArgs args, ReadRmsNorm(io));
  const Tensor &x = args.x, &w = args.w, &dy = args.dy;
  const int64_t d = args.d, rows = args.rows;
  const double eps = args.eps;
  Shape rshape(x.shape().begin(), x.shape().end() - 1);
  Tensor y = NewTensor<T>(x.shape()), rstd = NewTensor<T>(rshape);
  const T* wp = w.defined() ? Ptr<T>(w) : nullptr;
  kernels::RmsNormForward(Ptr<T>(x), wp, rows, d, eps, Ptr<T>(y), Ptr<T>(rstd));
  io.Out("y", y);
  io.Out("rstd", rstd);
  if (!io.backward()) return Status::OK();
  Tensor dx = NewTensor<T>(x.shape());
  Tensor dw = w.defined() ? NewTensor<T>({d}) : Tensor();
  kernels::RmsNormBackward(Ptr<T>(x), wp, Ptr<T>(rstd), Ptr<T>(dy), rows, d, Ptr<T>(dx),
                           w.defined() ? Ptr<T>(dw) : nullptr);
  io.Out("dx", dx);
  if (w.defined()) io.Out("dw", dw);
  return Status::OK();
}

// ---- situ_glu ----
StatusOr<kernels::GluActivation> ReadActivation(OpIo& io) {
  kernels::GluActivation act;
  ORRERY_ASSIGN_OR_RETURN(std::string kind, io.AttrString("activation", "situ"));
  if (kind != "situ" && kind != "silu") {
    return InvalidArgumentError("--attr activation=" + kind + ": expected situ or silu");
  }
  act.situ = kind == "situ";
  ORRERY_ASSIGN_OR_RETURN(act.beta, io.Attr("beta", 4.0));
  ORRERY_ASSIGN_OR_RETURN(act.beta_lin, io.Attr("beta_lin", 25.0));
  return act;
}

// The inputs of situ_glu, on either device.
struct GluArgs {
  Tensor a, u, dh;  // dh with --backward
  kernels::GluActivation act;
};

StatusOr<GluArgs> ReadGlu(OpIo& io) {
  GluArgs r;
  ORRERY_ASSIGN_OR_RETURN(r.a, io.Float("a", 0, "[...]"));
  ORRERY_ASSIGN_OR_RETURN(r.u, io.Float("u", 0, "as a"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("u", r.u, r.a.shape(), "as a"));
  ORRERY_ASSIGN_OR_RETURN(r.act, ReadActivation(io));
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(r.dh, io.Float("dh", 0, "as a"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dh", r.dh, r.a.shape(), "as a"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  return r;
}

template <typename T>
Status RunGluTyped(OpIo& io) {
  ORRERY_ASSIGN_OR_RETURN(GluArgs args, ReadGlu(io));
  const Tensor &a = args.a, &u = args.u, &dh = args.dh;
  const kernels::GluActivation& act = args.act;
  Tensor h = NewTensor<T>(a.shape());
  kernels::GluForward(act, Ptr<T>(a), Ptr<T>(u), a.numel(), Ptr<T>(h));
  io.Out("h", h);
  if (!io.backward()) return Status::OK();
  Tensor da = NewTensor<T>(a.shape()), du = NewTensor<T>(a.shape());
  kernels::GluBackward(act, Ptr<T>(a), Ptr<T>(u), Ptr<T>(dh), a.numel(), Ptr<T>(da), Ptr<T>(du));
  io.Out("da", da);
  io.Out("du", du);
  return Status::OK();
}

// ---- attn_res (kernels/attn_res.h) ----
Status RunAttnRes(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor src, io.Float("sources", 0, "[S, ..., D]"));
  if (src.ndim() < 2) return io.Error("tensor 'sources' must be [S, ..., D]");
  const int64_t s = src.dim(0), d = src.dim(src.ndim() - 1), rows = src.numel() / (s * d);
  ORRERY_ASSIGN_OR_RETURN(Tensor w, io.Float("w", 1, "[D]"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("w", w, {d}, "[D], D = the sources' last dim"));
  ORRERY_ASSIGN_OR_RETURN(Tensor gamma, io.Optional("gamma", 1, "[D]"));
  if (gamma.defined()) {
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("gamma", gamma, {d}, "[D]"));
  } else {
    gamma = Tensor::FromVector<float>({d}, std::vector<float>(d, 1.0f));
  }
  ORRERY_ASSIGN_OR_RETURN(double eps, io.Attr("eps", 1e-5));
  Shape hshape(src.shape().begin() + 1, src.shape().end());
  Tensor dh;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dh, io.Float("dh", 0, "[..., D]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dh", dh, hshape, "the sources without S"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "sources"));
  ORRERY_ASSIGN_OR_RETURN(Tensor src3, src.Reshape({s, rows, d}));
  ORRERY_ASSIGN_OR_RETURN(Tensor srcg, Upload(src3, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor wg, Upload(w, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor gg, Upload(gamma, dt, device));
  // The op's sources: views [rows, D] of the uploaded stack.
  auto rows_of = [&](const Tensor& stack) -> StatusOr<std::vector<Tensor>> {
    std::vector<Tensor> out;
    for (int64_t i = 0; i < s; ++i) {
      ORRERY_ASSIGN_OR_RETURN(Tensor one, stack.Slice(i, i + 1));
      ORRERY_ASSIGN_OR_RETURN(one, one.Reshape({rows, d}));
      out.push_back(one);
    }
    return out;
  };
  ORRERY_ASSIGN_OR_RETURN(std::vector<Tensor> sources, rows_of(srcg));
  Tensor hg, p;
  Status st = kernels::AttnResMix(sources, wg, gg, eps, &hg, &p);
  if (!st.ok()) return io.Error(st.message());
  Shape pshape(hshape.begin(), hshape.end() - 1);
  pshape.push_back(s);
  ORRERY_RETURN_IF_ERROR(Emit(io, "h", hg, hshape));
  ORRERY_RETURN_IF_ERROR(Emit(io, "p", p, pshape));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dh2, dh.Reshape({rows, d}));
  ORRERY_ASSIGN_OR_RETURN(Tensor dhg, Upload(dh2, dt, device));
  // The op accumulates into the sources' gradients: zeros, in its gradient dtype.
  const DType grad_dt = device.is_cpu() ? dt : DType::kF32;
  ORRERY_ASSIGN_OR_RETURN(Tensor dsrc, gpu::ZerosOn({s, rows, d}, grad_dt, device));
  ORRERY_ASSIGN_OR_RETURN(std::vector<Tensor> dsources, rows_of(dsrc));
  Tensor dw, dgamma;
  st = kernels::AttnResMixGrad(sources, wg, gg, eps, p, dhg, &dsources, &dw, &dgamma);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "dsources", dsrc, src.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dw", dw, {d}));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dgamma", dgamma, {d}));
  return Status::OK();
}

// ---- moe: one Stable LatentMoE layer ----
// The inputs of moe, on either device, and the layer's config.
struct MoeArgs {
  Tensor x, router, down, up, w1, w3, w2, lnorm, s1, s3, s2, bias, forced, dy;
  ModelConfig c;
};

StatusOr<MoeArgs> ReadMoe(OpIo& io) {
  MoeArgs r;
  ORRERY_ASSIGN_OR_RETURN(r.x, io.Float("x", 2, "[N, D]"));
  const int64_t n = r.x.dim(0), d = r.x.dim(1);
  ORRERY_ASSIGN_OR_RETURN(r.router, io.Float("router", 2, "[E, D]"));
  const int64_t e = r.router.dim(0);
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("router", r.router, {e, d}, "[E, D], D = x's width"));
  ORRERY_ASSIGN_OR_RETURN(r.down, io.Optional("down", 2, "[L, D]"));
  ORRERY_ASSIGN_OR_RETURN(r.up, io.Optional("up", 2, "[D, L]"));
  if (r.down.defined() != r.up.defined()) {
    return io.Error("give both 'down' [L, D] and 'up' [D, L] (latent experts) or neither");
  }
  const int64_t l = r.down.defined() ? r.down.dim(0) : d;
  if (r.down.defined()) {
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("down", r.down, {l, d}, "[L, D]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("up", r.up, {d, l}, "[D, L]"));
  }
  ORRERY_ASSIGN_OR_RETURN(r.w1, io.Float("experts.w1", 3, "[E, F, L]"));
  const int64_t f = r.w1.dim(1);
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("experts.w1", r.w1, {e, f, l}, "[E, F, L]"));
  ORRERY_ASSIGN_OR_RETURN(r.w3, io.Float("experts.w3", 3, "[E, F, L]"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("experts.w3", r.w3, {e, f, l}, "[E, F, L]"));
  ORRERY_ASSIGN_OR_RETURN(r.w2, io.Float("experts.w2", 3, "[E, L, F]"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("experts.w2", r.w2, {e, l, f}, "[E, L, F]"));
  ORRERY_ASSIGN_OR_RETURN(r.lnorm, io.Optional("latent_norm", 1, "[L]"));
  if (r.lnorm.defined()) {
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("latent_norm", r.lnorm, {l}, "[L]"));
  }
  ORRERY_ASSIGN_OR_RETURN(r.s1, io.Optional("shared.w1", 2, "[Fs, D]"));
  ORRERY_ASSIGN_OR_RETURN(r.s3, io.Optional("shared.w3", 2, "[Fs, D]"));
  ORRERY_ASSIGN_OR_RETURN(r.s2, io.Optional("shared.w2", 2, "[D, Fs]"));
  const int64_t fs = r.s1.defined() ? r.s1.dim(0) : 0;
  if (r.s1.defined() || r.s3.defined() || r.s2.defined()) {
    if (!r.s1.defined() || !r.s3.defined() || !r.s2.defined()) {
      return io.Error("the shared expert needs all of shared.w1, shared.w3 and shared.w2");
    }
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("shared.w1", r.s1, {fs, d}, "[Fs, D]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("shared.w3", r.s3, {fs, d}, "[Fs, D]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("shared.w2", r.s2, {d, fs}, "[D, Fs]"));
  }
  ORRERY_ASSIGN_OR_RETURN(r.bias, io.Optional("bias", 1, "[E]"));
  if (r.bias.defined()) {
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("bias", r.bias, {e}, "[E]"));
    ORRERY_ASSIGN_OR_RETURN(r.bias, r.bias.Cast(DType::kF32));
  }
  ORRERY_ASSIGN_OR_RETURN(double top_k, io.Attr("top_k", 0));
  const int64_t k = static_cast<int64_t>(top_k);
  if (k < 1 || k > e) {
    return InvalidArgumentError("--attr top_k: expected an integer in [1, E = " +
                                std::to_string(e) + "], got " + std::to_string(top_k));
  }
  ORRERY_ASSIGN_OR_RETURN(r.forced, io.Index("expert_ids", DType::kI32, "[N, top_k]"));
  if (r.forced.defined()) {
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("expert_ids", r.forced, {n, k}, "[N, top_k]"));
  }
  ORRERY_ASSIGN_OR_RETURN(kernels::GluActivation act, ReadActivation(io));
  ModelConfig& c = r.c;
  c.hidden_size = d;
  c.num_layers = 1;
  c.moe.num_experts = e;
  c.moe.top_k = k;
  c.moe.expert_intermediate = f;
  c.moe.latent_dim = r.down.defined() ? l : 0;
  c.moe.latent_norm = r.lnorm.defined();
  c.moe.num_shared_experts = fs > 0 ? 1 : 0;
  c.moe.shared_intermediate = fs;
  ORRERY_ASSIGN_OR_RETURN(c.moe.routed_scaling_factor, io.Attr("routed_scale", 1.0));
  ORRERY_ASSIGN_OR_RETURN(c.rms_norm_eps, io.Attr("eps", 1e-5));
  c.activation = act.situ ? Activation::kSitu : Activation::kSilu;
  c.situ_beta = act.beta;
  c.situ_linear_beta = act.beta_lin;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(r.dy, io.Float("dy", 2, "[N, D]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dy", r.dy, r.x.shape(), "as x"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  return r;
}

// The host layer (model::MoeLayer) in the inputs' dtype.
template <typename T>
Status RunMoeTyped(OpIo& io) {
  ORRERY_ASSIGN_OR_RETURN(MoeArgs a, ReadMoe(io));
  const ModelConfig& c = a.c;
  const int64_t n = a.x.dim(0), d = a.x.dim(1);
  std::vector<Parameter> params;
  ParamStore store(&params, 0, DTypeOf<T>::value, &c);
  MoeLayer<T> layer(store, c, "moe");
  // File tensor (and, for stacked experts, the slice) of each layer parameter.
  auto source = [&](const std::string& name, int64_t* index) -> const Tensor* {
    *index = -1;
    const std::string rest = name.substr(4);  // after "moe."
    if (rest == "router") return &a.router;
    if (rest == "down") return &a.down;
    if (rest == "up") return &a.up;
    if (rest == "latent_norm") return &a.lnorm;
    if (rest == "shared.w1") return &a.s1;
    if (rest == "shared.w3") return &a.s3;
    if (rest == "shared.w2") return &a.s2;
    const size_t dot = rest.rfind('.');
    *index = std::stoll(rest.substr(8, dot - 8));  // "experts.<e>.wN"
    const std::string which = rest.substr(dot + 1);
    return which == "w1" ? &a.w1 : which == "w3" ? &a.w3 : &a.w2;
  };
  for (Parameter& p : params) {
    int64_t index;
    const Tensor* t = source(p.name, &index);
    const T* from = Ptr<T>(*t) + (index >= 0 ? index * p.value.numel() : 0);
    std::copy_n(from, p.value.numel(), Ptr<T>(p.value));
  }
  typename MoeLayer<T>::Cache cache;
  Tensor y = NewTensor<T>({n, d});
  ORRERY_RETURN_IF_ERROR(
      layer.Forward(Ptr<T>(a.x), n, a.forced.defined() ? a.forced.data<int32_t>() : nullptr,
                    a.bias.defined() ? a.bias.data<float>() : nullptr, Ptr<T>(y), &cache));
  io.Out("y", y);
  io.Out("expert_ids", cache.ids);
  io.Out("scores", cache.scores);
  if (!io.backward()) return Status::OK();
  Tensor dx = NewTensor<T>({n, d});
  layer.Backward(Ptr<T>(a.x), n, cache, Ptr<T>(a.dy), Ptr<T>(dx));
  io.Out("dx", dx);
  // Gradients in the file's layout: "d" + tensor name, experts stacked again.
  std::map<std::string, Tensor> grads;
  for (Parameter& p : params) {
    int64_t index;
    const Tensor* t = source(p.name, &index);
    std::string file_name = p.name.substr(4);
    if (index >= 0) file_name = "experts." + file_name.substr(file_name.rfind('.') + 1);
    Tensor& g = grads["d" + file_name];
    if (!g.defined()) g = NewTensor<T>(t->shape());
    std::copy_n(Ptr<T>(p.grad), p.value.numel(),
                Ptr<T>(g) + (index >= 0 ? index * p.value.numel() : 0));
  }
  for (auto& [name, g] : grads) io.Out(name, g);
  return Status::OK();
}

// The GPU model's layer (model::gpu::GpuMoe over kernels/moe.h): f32 masters and gradients, the
// compute copies in bf16 when x is stored as bf16 (else f32), the router in f32.
Status RunMoeCuda(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(MoeArgs a, ReadMoe(io));
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "x"));
  const std::pair<const char*, const Tensor*> weights[] = {
      {"router", &a.router},     {"down", &a.down},     {"up", &a.up},
      {"latent_norm", &a.lnorm}, {"experts.w1", &a.w1}, {"experts.w3", &a.w3},
      {"experts.w2", &a.w2},     {"shared.w1", &a.s1},  {"shared.w3", &a.s3},
      {"shared.w2", &a.s2}};
  gpu::WeightTable table;
  std::vector<std::pair<std::string, gpu::Weight>> given;
  for (const auto& [name, t] : weights) {
    if (!t->defined()) continue;
    gpu::Weight w;
    ORRERY_ASSIGN_OR_RETURN(w.master, Upload(*t, DType::kF32, device));
    ORRERY_ASSIGN_OR_RETURN(w.grad, gpu::ZerosOn(t->shape(), DType::kF32, device));
    ORRERY_ASSIGN_OR_RETURN(w.compute, gpu::As(w.master, dt));
    table.Put(std::string("moe.") + name, w);
    given.emplace_back(name, w);
  }
  gpu::GpuMoe layer;
  ORRERY_RETURN_IF_ERROR(layer.Init(table, a.c, "moe"));
  ORRERY_ASSIGN_OR_RETURN(Tensor xg, Upload(a.x, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor bias, Upload(a.bias, DType::kF32, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor forced, Upload(a.forced, DType::kI32, device));
  Tensor y;
  gpu::GpuMoe::Cache cache;
  ORRERY_RETURN_IF_ERROR(layer.Forward(xg, bias, forced, &y, &cache));
  ORRERY_RETURN_IF_ERROR(Emit(io, "y", y, a.x.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "expert_ids", cache.ids, cache.ids.shape()));
  ORRERY_ASSIGN_OR_RETURN(Tensor scores, Download(cache.scores, cache.scores.shape()));
  io.Out("scores", scores);
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dyg, Upload(a.dy, dt, device));
  Tensor dx;
  ORRERY_RETURN_IF_ERROR(layer.Backward(cache, dyg, &dx));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dx", dx, a.x.shape()));
  for (const auto& [name, w] : given) {
    ORRERY_ASSIGN_OR_RETURN(Tensor g, Download(w.grad, w.grad.shape()));
    io.Out("d" + name, g);
  }
  return Status::OK();
}

// ---- rmsnorm and situ_glu on cuda ----
Status RunRmsNormCuda(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(RmsNormArgs args, ReadRmsNorm(io));
  const Tensor &x = args.x, &w = args.w, &dy = args.dy;
  const int64_t d = args.d, rows = args.rows;
  const double eps = args.eps;
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "x"));
  ORRERY_ASSIGN_OR_RETURN(Tensor x2, x.Reshape({rows, d}));
  ORRERY_ASSIGN_OR_RETURN(Tensor xg, Upload(x2, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor wg, Upload(w, dt, device));
  Tensor y, rstd;
  ORRERY_RETURN_IF_ERROR(kernels::RmsNorm(xg, wg, eps, &y, &rstd));
  const Shape rshape(x.shape().begin(), x.shape().end() - 1);
  ORRERY_RETURN_IF_ERROR(Emit(io, "y", y, x.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "rstd", rstd, rshape));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dy2, dy.Reshape({rows, d}));
  ORRERY_ASSIGN_OR_RETURN(Tensor dyg, Upload(dy2, dt, device));
  Tensor dx, dw;
  ORRERY_RETURN_IF_ERROR(kernels::RmsNormGrad(xg, wg, rstd, dyg, &dx, w.defined() ? &dw : nullptr));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dx", dx, x.shape()));
  if (w.defined()) {
    ORRERY_RETURN_IF_ERROR(Emit(io, "dw", dw, {d}));
  }
  return Status::OK();
}

Status RunGluCuda(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(GluArgs args, ReadGlu(io));
  const Tensor &a = args.a, &u = args.u, &dh = args.dh;
  const kernels::GluActivation& act = args.act;
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "a"));
  ORRERY_ASSIGN_OR_RETURN(Tensor ag, Upload(a, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor ug, Upload(u, dt, device));
  Tensor h;
  ORRERY_RETURN_IF_ERROR(kernels::Glu(act, ag, ug, &h));
  ORRERY_RETURN_IF_ERROR(Emit(io, "h", h, a.shape()));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dhg, Upload(dh, dt, device));
  Tensor da, du;
  ORRERY_RETURN_IF_ERROR(kernels::GluGrad(act, ag, ug, dhg, &da, &du));
  ORRERY_RETURN_IF_ERROR(Emit(io, "da", da, a.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "du", du, a.shape()));
  return Status::OK();
}

// ---- matmul: c = alpha op(a) op(b) + beta c (kernels/matmul.h), on either device ----
StatusOr<bool> FlagAttr(OpIo& io, const std::string& key) {
  ORRERY_ASSIGN_OR_RETURN(double v, io.Attr(key, 0));
  if (v != 0 && v != 1) {
    return InvalidArgumentError("--attr " + key + "=" + std::to_string(v) + ": expected 0 or 1");
  }
  return v == 1;
}

Status RunMatmul(OpIo& io, Device device) {
  if (io.backward()) {
    return io.Error(
        "op matmul has no --backward (its gradients are matmuls: run it with the "
        "transposes of docs/ops.md)");
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor a, io.Float("a", 2, "[M, K] ([K, M] with trans_a)"));
  ORRERY_ASSIGN_OR_RETURN(Tensor b, io.Float("b", 2, "[K, N] ([N, K] with trans_b)"));
  ORRERY_ASSIGN_OR_RETURN(Tensor c, io.Optional("c", 2, "[M, N]"));
  kernels::MatmulOptions o;
  ORRERY_ASSIGN_OR_RETURN(o.trans_a, FlagAttr(io, "trans_a"));
  ORRERY_ASSIGN_OR_RETURN(o.trans_b, FlagAttr(io, "trans_b"));
  ORRERY_ASSIGN_OR_RETURN(double alpha, io.Attr("alpha", 1.0));
  ORRERY_ASSIGN_OR_RETURN(double beta, io.Attr("beta", 0.0));
  ORRERY_RETURN_IF_ERROR(io.Finish());
  o.alpha = static_cast<float>(alpha);
  o.beta = static_cast<float>(beta);
  if (o.beta != 0.0f && !c.defined()) return io.Error("tensor 'c' [M, N] is missing (beta != 0)");
  if (device.is_cpu()) {
    Tensor out = o.beta != 0.0f ? c : Tensor();
    Status st = kernels::Matmul(a, b, o, &out);
    if (!st.ok()) return io.Error(st.message());
    io.Out("c", out);
    return Status::OK();
  }
  ORRERY_RETURN_IF_ERROR(RefuseF64OnCuda(io));
  // bf16 operands accumulate into an f32 c (the weight-gradient form) when c is given.
  const DType dt = io.StoredAsBf16("a") && io.StoredAsBf16("b") ? DType::kBF16 : DType::kF32;
  ORRERY_ASSIGN_OR_RETURN(Tensor ag, Upload(a, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor bg, Upload(b, dt, device));
  Tensor cg;
  if (o.beta != 0.0f) {
    ORRERY_ASSIGN_OR_RETURN(cg, Upload(c, DType::kF32, device));
  }
  Status st = kernels::Matmul(ag, bg, o, &cg);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "c", cg, cg.shape()));
  return Status::OK();
}

// ---- grouped_gemm: the MoE experts' products over rows grouped by expert (grouped_gemm.h) ----
Status RunGroupedGemm(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor x, io.Float("x", 2, "[M, K]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor w, io.Float("w", 3, "[E, N, K]"));
  const int64_t m = x.dim(0), k = x.dim(1), e = w.dim(0), n = w.dim(1);
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("w", w, {e, n, k}, "[E, N, K], K = x's columns"));
  ORRERY_ASSIGN_OR_RETURN(Tensor off, io.Index("offsets", DType::kI64, "[E + 1]"));
  if (!off.defined()) return io.Error("tensor 'offsets' [E + 1] (integers) is missing");
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("offsets", off, {e + 1}, "[E + 1], E = w's experts"));
  // The values are checked here for both devices (the CUDA kernels trust them).
  const int64_t* o = off.data<int64_t>();
  for (int64_t i = 0; i <= e; ++i) {
    if (o[i] < 0 || o[i] > m || (i > 0 && o[i] < o[i - 1])) {
      return io.Error("offsets[" + std::to_string(i) + "] = " + std::to_string(o[i]) +
                      ": expected non-decreasing values in [0, M = " + std::to_string(m) + "]");
    }
  }
  Tensor dy;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dy, io.Float("dy", 2, "[M, N]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dy", dy, {m, n}, "[M, N]"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  // Rows outside [offsets[0], offsets[E]) are left alone by the op: they come out as zeros.
  auto zeros = [&](const Shape& shape, DType dt) -> StatusOr<Tensor> {
    ORRERY_ASSIGN_OR_RETURN(Tensor t, Tensor::Allocate(shape, dt, device));
    ORRERY_RETURN_IF_ERROR(t.SetZero());
    return t;
  };
  if (device.is_cpu()) {
    ORRERY_ASSIGN_OR_RETURN(Tensor y, zeros({m, n}, x.dtype()));
    Status st = kernels::GroupedGemmForward(x, w, off, &y);
    if (!st.ok()) return io.Error(st.message());
    io.Out("y", y);
    if (!io.backward()) return Status::OK();
    ORRERY_ASSIGN_OR_RETURN(Tensor dx, zeros({m, k}, x.dtype()));
    Tensor dw;
    st = kernels::GroupedGemmInputGrad(dy, w, off, false, &dx);
    if (st.ok()) st = kernels::GroupedGemmWeightGrad(dy, x, off, &dw);
    if (!st.ok()) return io.Error(st.message());
    io.Out("dx", dx);
    io.Out("dw", dw);
    return Status::OK();
  }
  ORRERY_RETURN_IF_ERROR(RefuseF64OnCuda(io));
  if (!kernels::GroupedGemmSupports(n, k)) {
    return io.Error("on cuda N = " + std::to_string(n) + " and K = " + std::to_string(k) +
                    " must be multiples of " + std::to_string(kernels::kGroupedGemmDimMultiple));
  }
  // The CUDA kernels take bf16 operands (f32 sums); f32 inputs are rounded to bf16.
  ORRERY_ASSIGN_OR_RETURN(Tensor xg, Upload(x, DType::kBF16, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor wg, Upload(w, DType::kBF16, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor og, off.To(device));
  ORRERY_ASSIGN_OR_RETURN(Tensor y, zeros({m, n}, DType::kF32));
  Status st = kernels::GroupedGemmForward(xg, wg, og, &y);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "y", y, {m, n}));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dyg, Upload(dy, DType::kBF16, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor dx, zeros({m, k}, DType::kF32));
  Tensor dw;
  st = kernels::GroupedGemmInputGrad(dyg, wg, og, false, &dx);
  if (st.ok()) st = kernels::GroupedGemmWeightGrad(dyg, xg, og, &dw);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "dx", dx, {m, k}));
  return Emit(io, "dw", dw, {e, n, k});
}

// ---- mla_keys: gated MLA's per-head keys and values (kernels/mla_keys.h) ----
Status RunMlaKeys(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor kv, io.Float("kv", 3, "[N, H, Dn + Dv]"));
  const int64_t n = kv.dim(0), h = kv.dim(1);
  ORRERY_ASSIGN_OR_RETURN(Tensor kr, io.Float("kr", 2, "[N, Dr]"));
  const int64_t dr = kr.dim(1);
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("kr", kr, {n, dr}, "[N, Dr], N = kv's tokens"));
  ORRERY_ASSIGN_OR_RETURN(double nope, io.Attr("nope_dim", 0));
  const int64_t dn = static_cast<int64_t>(nope);
  if (dn < 1 || dn >= kv.dim(2)) {
    return InvalidArgumentError("--attr nope_dim: expected an integer in [1, Dn + Dv = " +
                                std::to_string(kv.dim(2)) + "), got " + std::to_string(nope));
  }
  const int64_t dv = kv.dim(2) - dn;
  Tensor dk, dvh;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dk, io.Float("dk", 3, "[N, H, Dn + Dr]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dk", dk, {n, h, dn + dr}, "as k"));
    ORRERY_ASSIGN_OR_RETURN(dvh, io.Float("dv", 3, "[N, H, Dv]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dv", dvh, {n, h, dv}, "as v"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "kv"));
  ORRERY_ASSIGN_OR_RETURN(Tensor kvg, Upload(kv, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor krg, Upload(kr, dt, device));
  Tensor k, v;
  Status st = kernels::MlaKeysValues(kvg, krg, dn, &k, &v);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "k", k, k.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "v", v, v.shape()));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dkg, Upload(dk, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor dvg, Upload(dvh, dt, device));
  Tensor dkv, dkr;
  st = kernels::MlaKeysValuesGrad(dkg, dvg, dn, &dkv, &dkr);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "dkv", dkv, kv.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dkr", dkr, kr.shape()));
  return Status::OK();
}

// ---- sigmoid_gate: y = x sigmoid(z), the KDA and gated-MLA output gates (kernels/gates.h) ----
Status RunSigmoidGate(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor x, io.Float("x", 0, "[...]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor z, io.Float("z", 0, "as x"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("z", z, x.shape(), "as x"));
  Tensor dy;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dy, io.Float("dy", 0, "as x"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dy", dy, x.shape(), "as x"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "x"));
  ORRERY_ASSIGN_OR_RETURN(Tensor xg, Upload(x, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor zg, Upload(z, dt, device));
  Tensor y;
  Status st = kernels::SigmoidGate(xg, zg, &y);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "y", y, x.shape()));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dyg, Upload(dy, dt, device));
  Tensor dx, dz;
  st = kernels::SigmoidGateGrad(xg, zg, dyg, &dx, &dz);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "dx", dx, x.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dz", dz, x.shape()));
  return Status::OK();
}

// ---- short_conv: the KDA layer's causal depthwise convolution + SiLU (kernels/short_conv.h) ----
Status RunShortConv(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor x, io.Float("x", 2, "[N, C]"));
  const int64_t n = x.dim(0), c = x.dim(1);
  ORRERY_ASSIGN_OR_RETURN(Tensor w, io.Float("w", 2, "[C, W]"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("w", w, {c, w.dim(1)}, "[C, W], C = x's channels"));
  ORRERY_ASSIGN_OR_RETURN(Tensor cu_t, io.Index("cu_seqlens", DType::kI64, "[docs + 1]"));
  Tensor dy;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dy, io.Float("dy", 2, "[N, C]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dy", dy, x.shape(), "as x"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(std::vector<int64_t> cu, Documents(io, cu_t, 1, n));
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "x"));
  ORRERY_ASSIGN_OR_RETURN(Tensor cug, OffsetsOn(cu, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor xg, Upload(x, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor wg, Upload(w, dt, device));
  Tensor y;
  Status st = kernels::ShortConvSilu(xg, wg, cug, &y);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "y", y, x.shape()));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dyg, Upload(dy, dt, device));
  Tensor dx, dw;
  st = kernels::ShortConvSiluGrad(xg, wg, cug, dyg, &dx, &dw);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "dx", dx, x.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dw", dw, w.shape()));
  return Status::OK();
}

// Integer ids [n] (targets, token ids) as i32 on `device`, undefined when absent.
StatusOr<Tensor> Ids(OpIo& io, const std::string& name, int64_t n, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor t, io.Index(name, DType::kI32, "[N]"));
  if (!t.defined()) return io.Error("tensor '" + name + "' [N] is missing (integers)");
  if (t.ndim() != 1) return io.Error("tensor '" + name + "' is " + t.ToString() + ", expected [N]");
  if (n >= 0) ORRERY_RETURN_IF_ERROR(io.ExpectShape(name, t, {n}, "[N], N = x's rows"));
  return t.To(device);
}

// ---- embedding: the token embedding's gather and scatter-add (kernels/embedding.h) ----
Status RunEmbedding(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor table, io.Float("table", 2, "[V, D]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor ids, Ids(io, "ids", -1, device));
  const int64_t n = ids.dim(0), d = table.dim(1);
  Tensor dy;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dy, io.Float("dy", 2, "[N, D]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dy", dy, {n, d}, "[N, D], N = the ids"));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "table"));
  ORRERY_ASSIGN_OR_RETURN(Tensor tg, Upload(table, dt, device));
  Tensor y;
  Status st = kernels::EmbeddingGather(tg, ids, &y);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "y", y, {n, d}));
  if (!io.backward()) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor dyg, Upload(dy, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor dtable,
                          gpu::ZerosOn(table.shape(), device.is_cpu() ? dt : DType::kF32, device));
  st = kernels::EmbeddingScatterAdd(ids, dyg, &dtable);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "dtable", dtable, table.shape()));
  return Status::OK();
}

// ---- lm_head_loss: the LM head fused with the masked cross-entropy (kernels/lm_head_loss.h) ----
Status RunLmHeadLoss(OpIo& io, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor x, io.Float("x", 2, "[N, D]"));
  const int64_t n = x.dim(0), d = x.dim(1);
  ORRERY_ASSIGN_OR_RETURN(Tensor w, io.Float("w", 2, "[V, D]"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("w", w, {w.dim(0), d}, "[V, D], D = x's width"));
  ORRERY_ASSIGN_OR_RETURN(Tensor targets, Ids(io, "targets", n, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor mask, io.Optional("mask", 1, "[N]"));
  if (mask.defined()) {
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("mask", mask, {n}, "[N]"));
  }
  ORRERY_ASSIGN_OR_RETURN(double chunk, io.Attr("chunk_rows", 4096));
  if (chunk < 1) {
    return InvalidArgumentError("--attr chunk_rows=" + std::to_string(chunk) +
                                ": expected a positive integer");
  }
  kernels::LmHeadLossOptions o;
  o.chunk_rows = static_cast<int64_t>(chunk);
  Tensor dloss;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dloss, io.Float("dloss_sum", 1, "[1]"));
    ORRERY_RETURN_IF_ERROR(io.ExpectShape("dloss_sum", dloss, {1}, "[1]"));
    ORRERY_ASSIGN_OR_RETURN(Tensor s, dloss.Cast(DType::kF64));
    o.grad_scale = s.data<double>()[0];
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "x"));
  ORRERY_ASSIGN_OR_RETURN(Tensor xg, Upload(x, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor wg, Upload(w, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor mg, Upload(mask, DType::kF32, device));
  double loss = 0;
  Tensor dx, dw;
  if (io.backward()) {
    ORRERY_ASSIGN_OR_RETURN(dw,
                            gpu::ZerosOn(w.shape(), device.is_cpu() ? dt : DType::kF32, device));
  }
  Status st = kernels::LmHeadCrossEntropy(
      xg, wg, targets, mg, o, &loss, io.backward() ? &dx : nullptr, io.backward() ? &dw : nullptr);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_ASSIGN_OR_RETURN(Tensor lh, Tensor::FromVector<double>({1}, {loss}).Cast(io.compute()));
  io.Out("loss_sum", lh);
  if (!io.backward()) return Status::OK();
  ORRERY_RETURN_IF_ERROR(Emit(io, "dx", dx, x.shape()));
  ORRERY_RETURN_IF_ERROR(Emit(io, "dw", dw, w.shape()));
  return Status::OK();
}

// ---- mla_decode: absorbed MLA decode over a paged latent cache (kernels/mla_decode.h) ----
Status RunMlaDecode(OpIo& io, Device device) {
  if (io.backward()) return io.Error("op mla_decode has no --backward (a decode step)");
  ORRERY_ASSIGN_OR_RETURN(Tensor q, io.Float("q", 4, "[N, Q, H, D]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor pages, io.Float("pages", 3, "[num_pages, page_size, D]"));
  const int64_t n = q.dim(0), nq = q.dim(1), h = q.dim(2), d = q.dim(3);
  if (pages.dim(2) != d) {
    return io.Error("tensor 'pages' is " + pages.ToString() +
                    ", expected [num_pages, page_size, D = " + std::to_string(d) + "] (as q)");
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor table,
                          io.Index("block_table", DType::kI32, "[N, max_pages_per_seq]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor lens, io.Index("context_lens", DType::kI32, "[N]"));
  if (!table.defined() || table.ndim() != 2 || table.dim(0) != n) {
    return io.Error("tensor 'block_table' is " +
                    (table.defined() ? table.ToString() : std::string("missing")) +
                    ", expected integers [N = " + std::to_string(n) + ", max_pages_per_seq]");
  }
  if (!lens.defined()) return io.Error("tensor 'context_lens' [N] is missing (op mla_decode)");
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("context_lens", lens, {n}, "[N], N = q's sequences"));
  // K3's defaults: a 64-wide rope part after the latent, the MHA form's (128 + 64)^-1/2 scale.
  ORRERY_ASSIGN_OR_RETURN(double dv_attr, io.Attr("dv", static_cast<double>(d > 64 ? d - 64 : d)));
  ORRERY_ASSIGN_OR_RETURN(double scale, io.Attr("scale", 1.0 / std::sqrt(192.0)));
  ORRERY_ASSIGN_OR_RETURN(double splits, io.Attr("max_splits", 0));
  const int64_t dv = static_cast<int64_t>(dv_attr);
  if (dv_attr != static_cast<double>(dv) || dv < 1 || dv > d) {
    return InvalidArgumentError("--attr dv: expected an integer in [1, D = " + std::to_string(d) +
                                "], got " + std::to_string(dv_attr));
  }
  if (splits != std::floor(splits) || splits < 0 || splits > kernels::kMaxMlaDecodeSplits) {
    return InvalidArgumentError("--attr max_splits: expected an integer in [0, " +
                                std::to_string(kernels::kMaxMlaDecodeSplits) + "], got " +
                                std::to_string(splits));
  }
  ORRERY_RETURN_IF_ERROR(io.Finish());
  // The index values are checked here for either device (on cuda the op trusts them).
  {
    const kernels::PagedLatentCache host{pages, table, lens};
    const Status st = kernels::CheckPagedLatentIndices(host, nq);
    if (!st.ok()) return io.Error(st.message());
  }
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "pages"));
  kernels::PagedLatentCache cache;
  ORRERY_ASSIGN_OR_RETURN(cache.pages, Upload(pages, dt, device));
  ORRERY_ASSIGN_OR_RETURN(cache.block_table, table.To(device));
  ORRERY_ASSIGN_OR_RETURN(cache.context_lens, lens.To(device));
  ORRERY_ASSIGN_OR_RETURN(Tensor qg, Upload(q, dt, device));
  kernels::MlaDecodeOptions opt;
  opt.max_splits = static_cast<int>(splits);
  Tensor o, lse;
  const Status st =
      kernels::MlaDecodePaged(qg, cache, dv, static_cast<float>(scale), opt, &o, &lse);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "o", o, {n, nq, h, dv}));
  ORRERY_RETURN_IF_ERROR(Emit(io, "lse", lse, {n, nq, h}));
  return Status::OK();
}

// ---- mla_prefill: prefix-causal attention, chunked prefill against a cached context
// (kernels/attention.h PrefixCausalAttention) ----
Status RunMlaPrefill(OpIo& io, Device device) {
  if (io.backward()) return io.Error("op mla_prefill has no --backward (an inference step)");
  ORRERY_ASSIGN_OR_RETURN(Tensor q, io.Float("q", 3, "[Nq, H, Dqk]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor k, io.Float("k", 3, "[Nk, H, Dqk]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor v, io.Float("v", 3, "[Nk, H, Dv]"));
  const int64_t nq = q.dim(0), nk = k.dim(0), h = q.dim(1), dqk = q.dim(2), dv = v.dim(2);
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("k", k, {nk, h, dqk}, "[Nk, H, Dqk], H and Dqk as q"));
  ORRERY_RETURN_IF_ERROR(io.ExpectShape("v", v, {nk, h, dv}, "[Nk, H, Dv], Nk and H as k"));
  ORRERY_ASSIGN_OR_RETURN(Tensor cu_q, io.Index("cu_seqlens_q", DType::kI64, "[N + 1]"));
  ORRERY_ASSIGN_OR_RETURN(Tensor cu_k, io.Index("cu_seqlens_k", DType::kI64, "[N + 1]"));
  if (cu_q.defined() != cu_k.defined()) {
    return io.Error("give both cu_seqlens_q and cu_seqlens_k, or neither (one sequence)");
  }
  if (!cu_q.defined()) {
    cu_q = Tensor::FromVector<int64_t>({2}, {0, nq});
    cu_k = Tensor::FromVector<int64_t>({2}, {0, nk});
  }
  ORRERY_ASSIGN_OR_RETURN(double scale, io.Attr("scale", 0.0));
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(dqk));
  ORRERY_RETURN_IF_ERROR(io.Finish());
  // The offsets are checked here for either device (on cuda the op trusts them).
  {
    const Status st = kernels::CheckPrefixOffsets(cu_q, cu_k, nq, nk);
    if (!st.ok()) return io.Error(st.message());
  }
  ORRERY_ASSIGN_OR_RETURN(DType dt, ComputeDType(io, device, "q"));
  ORRERY_ASSIGN_OR_RETURN(Tensor qg, Upload(q, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor kg, Upload(k, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor vg, Upload(v, dt, device));
  ORRERY_ASSIGN_OR_RETURN(Tensor cu_qg, cu_q.To(device));
  ORRERY_ASSIGN_OR_RETURN(Tensor cu_kg, cu_k.To(device));
  Tensor o, lse;
  const Status st = kernels::PrefixCausalAttention(qg, kg, vg, cu_qg, cu_kg, scale, &o, &lse);
  if (!st.ok()) return io.Error(st.message());
  ORRERY_RETURN_IF_ERROR(Emit(io, "o", o, {nq, h, dv}));
  ORRERY_RETURN_IF_ERROR(Emit(io, "lse", lse, {nq, h}));
  return Status::OK();
}

template <typename Fn32, typename Fn64>
Status ByDType(OpIo& io, Fn32 f32, Fn64 f64) {
  return io.compute() == DType::kF64 ? f64(io) : f32(io);
}

}  // namespace

const std::vector<std::string>& OpNames() {
  static const std::vector<std::string> names = {
      "kda",          "kda_recurrent", "mla",         "moe",         "attn_res",     "situ_glu",
      "rmsnorm",      "matmul",        "short_conv",  "mla_keys",    "sigmoid_gate", "embedding",
      "lm_head_loss", "mla_decode",    "mla_prefill", "grouped_gemm"};
  return names;
}

Status RunOp(const OpRunOptions& options) {
  bool known = false;
  std::string list;
  for (const std::string& n : OpNames()) {
    known |= n == options.op;
    list += (list.empty() ? "" : ", ") + n;
  }
  if (!known) {
    return InvalidArgumentError("--op " + options.op + ": unknown op (expected one of " + list +
                                ")");
  }
  ORRERY_ASSIGN_OR_RETURN(Device device, ParseDevice(options.device));
  if (device.is_cuda() && CudaDeviceCount() == 0) {
    return FailedPreconditionError("--device " + options.device + ": " +
                                   (CudaCompiledIn() ? "no CUDA device is visible on this machine"
                                                     : "this build has no CUDA support"));
  }
  ORRERY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(options.in_path));
  OpIo io(std::move(file), options);
  Status st;
  if (options.op == "kda" || options.op == "kda_recurrent") {
    st = RunKda(io, options, options.op == "kda_recurrent");
  } else if (options.op == "mla") {
    st = RunMla(io, device);
  } else if (options.op == "moe") {
    st = device.is_cuda() ? RunMoeCuda(io, device)
                          : ByDType(io, RunMoeTyped<float>, RunMoeTyped<double>);
  } else if (options.op == "attn_res") {
    st = RunAttnRes(io, device);
  } else if (options.op == "situ_glu") {
    st = device.is_cuda() ? RunGluCuda(io, device)
                          : ByDType(io, RunGluTyped<float>, RunGluTyped<double>);
  } else if (options.op == "matmul") {
    st = RunMatmul(io, device);
  } else if (options.op == "short_conv") {
    st = RunShortConv(io, device);
  } else if (options.op == "mla_keys") {
    st = RunMlaKeys(io, device);
  } else if (options.op == "sigmoid_gate") {
    st = RunSigmoidGate(io, device);
  } else if (options.op == "embedding") {
    st = RunEmbedding(io, device);
  } else if (options.op == "lm_head_loss") {
    st = RunLmHeadLoss(io, device);
  } else if (options.op == "mla_decode") {
    st = RunMlaDecode(io, device);
  } else if (options.op == "mla_prefill") {
    st = RunMlaPrefill(io, device);
  } else if (options.op == "grouped_gemm") {
    st = RunGroupedGemm(io, device);
  } else {
    st = device.is_cuda() ? RunRmsNormCuda(io, device)
                          : ByDType(io, RunRmsNormTyped<float>, RunRmsNormTyped<double>);
  }
  ORRERY_RETURN_IF_ERROR(st);
  return io.Write();
}

}  // namespace orrery::model
