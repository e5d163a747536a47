// KDA entry points: validate once, then dispatch by device (kernels/cpu or kernels/cuda).
#include "kernels/kda.h"

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/kda_cpu.h"
#include "kernels/kda_problem.h"
#include "kernels/kda_transforms.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/kda_cuda.h"
#endif

namespace orrery::kernels {

struct KdaSaved {
#if defined(ORRERY_KERNELS_CUDA)
  cuda::KdaTcSaved tc;  // what the tensor-core forward kept
#endif
};

namespace {

std::string Describe(const char* name, const Tensor& t) {
  return std::string(name) + " " + t.ToString();
}

Status ExpectShape(const char* name, const Tensor& t, const Shape& shape) {
  if (t.shape() != shape) {
    return InvalidArgumentError("kda: " + Describe(name, t) + ", expected shape " +
                                ShapeToString(shape));
  }
  return Status::OK();
}

Status ExpectSameDevice(const char* name, const Tensor& t, Device device) {
  if (!(t.device() == device)) {
    return InvalidArgumentError("kda: " + Describe(name, t) + " is on another device than q (" +
                                device.ToString() + ")");
  }
  return Status::OK();
}

// CPU: everything in one dtype, f32 or f64. CUDA: q, k, v, beta in f32 or bf16, g in f32 or
// their dtype.
Status CheckDTypes(const KdaInputs& in) {
  const DType dt = in.q.dtype();
  const bool cpu = in.q.device().is_cpu();
  if (cpu && dt != DType::kF32 && dt != DType::kF64) {
    return InvalidArgumentError("kda: " + Describe("q", in.q) + ", expected f32 or f64 on cpu");
  }
  if (!cpu && dt != DType::kF32 && dt != DType::kBF16) {
    return InvalidArgumentError("kda: " + Describe("q", in.q) + ", expected f32 or bf16 on cuda");
  }
  const std::pair<const char*, const Tensor*> same[] = {
      {"k", &in.k}, {"v", &in.v}, {"beta", &in.beta}};
  for (const auto& [name, t] : same) {
    if (t->dtype() != dt) {
      return InvalidArgumentError("kda: " + Describe(name, *t) + ", expected dtype " +
                                  std::string(DTypeName(dt)) + " like q");
    }
  }
  if (in.g.dtype() != dt && (cpu || in.g.dtype() != DType::kF32)) {
    return InvalidArgumentError("kda: " + Describe("g", in.g) + ", expected dtype " +
                                std::string(DTypeName(dt)) + (cpu ? "" : " or f32"));
  }
  return Status::OK();
}

}  // namespace

StatusOr<KdaProblem> ValidateKdaInputs(const KdaInputs& in, const KdaOptions& options) {
  const std::pair<const char*, const Tensor*> required[] = {
      {"q", &in.q}, {"k", &in.k}, {"v", &in.v}, {"g", &in.g}, {"beta", &in.beta}};
  for (const auto& [name, t] : required) {
    if (!t->defined())
      return InvalidArgumentError(std::string("kda: input ") + name + " is missing");
  }
  if (in.q.ndim() != 4) {
    return InvalidArgumentError("kda: " + Describe("q", in.q) + ", expected [B, T, H, K]");
  }
  if (in.v.ndim() != 4) {
    return InvalidArgumentError("kda: " + Describe("v", in.v) + ", expected [B, T, H, V]");
  }
  KdaProblem p;
  p.batch = in.q.dim(0);
  p.tokens = in.q.dim(1);
  p.heads = in.q.dim(2);
  p.key_dim = in.q.dim(3);
  p.value_dim = in.v.dim(3);
  p.device = in.q.device();
  p.dtype = in.q.dtype();
  p.algorithm = options.algorithm;
  p.chunk_size = options.chunk_size;
  if (p.heads < 1 || p.key_dim < 1 || p.value_dim < 1) {
    return InvalidArgumentError("kda: " + Describe("q", in.q) + " / " + Describe("v", in.v) +
                                ": H, K and V must be at least 1");
  }
  if (p.key_dim > 256 || p.value_dim > 256) {
    return InvalidArgumentError("kda: K = " + std::to_string(p.key_dim) +
                                ", V = " + std::to_string(p.value_dim) + ", expected at most 256");
  }
  const Shape qk = {p.batch, p.tokens, p.heads, p.key_dim};
  ORRERY_RETURN_IF_ERROR(ExpectShape("k", in.k, qk));
  ORRERY_RETURN_IF_ERROR(ExpectShape("v", in.v, {p.batch, p.tokens, p.heads, p.value_dim}));
  ORRERY_RETURN_IF_ERROR(ExpectShape("g", in.g, qk));
  ORRERY_RETURN_IF_ERROR(ExpectShape("beta", in.beta, {p.batch, p.tokens, p.heads}));
  for (const auto& [name, t] : required)
    ORRERY_RETURN_IF_ERROR(ExpectSameDevice(name, *t, p.device));
  ORRERY_RETURN_IF_ERROR(CheckDTypes(in));
  if (options.algorithm == KdaAlgorithm::kChunked && options.chunk_size != 16 &&
      options.chunk_size != 32 && options.chunk_size != 64) {
    return InvalidArgumentError("kda: chunk_size " + std::to_string(options.chunk_size) +
                                ", expected 16, 32 or 64");
  }
  if (!std::isfinite(options.scale)) {
    return InvalidArgumentError("kda: scale is not finite");
  }
  p.scale = options.scale > 0.0f
                ? options.scale
                : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.key_dim)));

  if (in.cu_seqlens.defined()) {
    const Tensor& cu = in.cu_seqlens;
    if (cu.dtype() != DType::kI64 || cu.ndim() != 1 || cu.dim(0) < 2) {
      return InvalidArgumentError("kda: " + Describe("cu_seqlens", cu) +
                                  ", expected i64 [N + 1] with N >= 1");
    }
    if (p.batch != 1) {
      return InvalidArgumentError("kda: cu_seqlens given with B = " + std::to_string(p.batch) +
                                  ", expected B = 1 (packed sequences)");
    }
    Tensor host = cu;
    if (!cu.device().is_cpu()) {
      ORRERY_ASSIGN_OR_RETURN(host, cu.To(Device::Cpu()));
    }
    const int64_t* c = host.data<int64_t>();
    p.seq_start.assign(c, c + cu.dim(0));
    if (p.seq_start.front() != 0 || p.seq_start.back() != p.tokens) {
      return InvalidArgumentError(
          "kda: cu_seqlens must start at 0 and end at T = " + std::to_string(p.tokens) + ", got " +
          std::to_string(p.seq_start.front()) + " .. " + std::to_string(p.seq_start.back()));
    }
    for (size_t i = 1; i < p.seq_start.size(); ++i) {
      if (p.seq_start[i] < p.seq_start[i - 1]) {
        return InvalidArgumentError("kda: cu_seqlens is not non-decreasing at index " +
                                    std::to_string(i));
      }
    }
  } else {
    p.seq_start.resize(p.batch + 1);
    for (int64_t b = 0; b <= p.batch; ++b) p.seq_start[b] = b * p.tokens;
  }

  if (in.initial_state.defined()) {
    const Tensor& s = in.initial_state;
    ORRERY_RETURN_IF_ERROR(
        ExpectShape("initial_state", s, {p.num_sequences(), p.heads, p.key_dim, p.value_dim}));
    ORRERY_RETURN_IF_ERROR(ExpectSameDevice("initial_state", s, p.device));
    const bool ok =
        s.dtype() == DType::kF32 || (p.dtype == DType::kF64 && s.dtype() == DType::kF64);
    if (!ok) {
      return InvalidArgumentError("kda: " + Describe("initial_state", s) + ", expected f32" +
                                  std::string(p.dtype == DType::kF64 ? " or f64" : ""));
    }
  }
  return p;
}

namespace {

// The recurrence on validated (already transformed) inputs, by device.
// `fused`: CUDA tensor-core inputs only, `in` raw and the transforms applied as chunks load.
Status RunForward(const KdaProblem& p, const KdaInputs& in, const KdaOptions& options,
                  KdaOutputs* out, const KdaInputTransforms* fused) {
  if (p.device.is_cpu()) return cpu::KdaForwardCpu(p, in, options.output_final_state, out);
#if defined(ORRERY_KERNELS_CUDA)
  if (!options.keep_for_backward) {
    return cuda::KdaForwardCuda(p, in, options.output_final_state, out, nullptr, fused);
  }
  auto saved = std::make_shared<KdaSaved>();
  ORRERY_RETURN_IF_ERROR(
      cuda::KdaForwardCuda(p, in, options.output_final_state, out, &saved->tc, fused));
  out->saved = std::move(saved);
  return Status::OK();
#else
  (void)fused;  // only the CUDA kernels fuse anything
  return FailedPreconditionError("kda: inputs are on " + p.device.ToString() +
                                 " but this build has no CUDA kernels");
#endif
}

// `fused` as for RunForward: the raw inputs' gradients come back.
Status RunBackward(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                   const Tensor& d_final_state, KdaGrads* grads, const KdaSaved* saved,
                   const KdaInputTransforms* fused) {
  if (p.device.is_cpu()) return cpu::KdaBackwardCpu(p, in, d_o, d_final_state, grads);
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::KdaBackwardCuda(p, in, d_o, d_final_state, grads,
                               saved != nullptr && saved->tc.chunks > 0 ? &saved->tc : nullptr,
                               fused);
#else
  (void)saved;  // only the CUDA kernels keep anything
  (void)fused;
  return FailedPreconditionError("kda backward: inputs are on " + p.device.ToString() +
                                 " but this build has no CUDA kernels");
#endif
}

}  // namespace

Status KdaForward(const KdaInputs& in, const KdaOptions& options, KdaOutputs* out) {
  PhaseScope phase("op.kda_forward");
  ORRERY_ASSIGN_OR_RETURN(KdaProblem p, ValidateKdaInputs(in, options));
  ORRERY_RETURN_IF_ERROR(ValidateKdaTransformInputs(p, in, options.transforms));
  out->saved.reset();
  if (!options.transforms.any()) return RunForward(p, in, options, out, nullptr);
#if defined(ORRERY_KERNELS_CUDA)
  // The tensor-core forward applies the transforms as it loads each chunk: no separate pass.
  if (p.device.is_cuda() && cuda::KdaTcSupported(p, in)) {
    return RunForward(p, in, options, out, &options.transforms);
  }
#endif
  ORRERY_ASSIGN_OR_RETURN(KdaTransformed x, ApplyKdaInputTransforms(p, in, options.transforms));
  return RunForward(p, x.in, options, out, nullptr);
}

Status KdaBackward(const KdaInputs& in, const Tensor& d_o, const Tensor& d_final_state,
                   const KdaOptions& options, KdaGrads* grads, const KdaSaved* saved) {
  PhaseScope phase("op.kda_backward");
  ORRERY_ASSIGN_OR_RETURN(KdaProblem p, ValidateKdaInputs(in, options));
  ORRERY_RETURN_IF_ERROR(ValidateKdaTransformInputs(p, in, options.transforms));
  if (!d_o.defined()) return InvalidArgumentError("kda backward: d_o is missing");
  ORRERY_RETURN_IF_ERROR(ExpectShape("d_o", d_o, in.v.shape()));
  ORRERY_RETURN_IF_ERROR(ExpectSameDevice("d_o", d_o, p.device));
  if (d_o.dtype() != in.v.dtype()) {
    return InvalidArgumentError("kda backward: " + Describe("d_o", d_o) + ", expected dtype " +
                                std::string(DTypeName(in.v.dtype())) + " like v");
  }
  if (d_final_state.defined()) {
    ORRERY_RETURN_IF_ERROR(ExpectShape("d_final_state", d_final_state,
                                       {p.num_sequences(), p.heads, p.key_dim, p.value_dim}));
    ORRERY_RETURN_IF_ERROR(ExpectSameDevice("d_final_state", d_final_state, p.device));
    const DType sd = p.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
    if (d_final_state.dtype() != sd) {
      return InvalidArgumentError("kda backward: " + Describe("d_final_state", d_final_state) +
                                  ", expected " + std::string(DTypeName(sd)));
    }
  }
  *grads = KdaGrads();
  if (!options.transforms.any()) {
    return RunBackward(p, in, d_o, d_final_state, grads, saved, nullptr);
  }
#if defined(ORRERY_KERNELS_CUDA)
  // The tensor-core backward applies the transforms as each chunk loads and their chain rule
  // before it writes the gradients: no separate passes.
  if (p.device.is_cuda() && cuda::KdaTcSupported(p, in)) {
    return RunBackward(p, in, d_o, d_final_state, grads, saved, &options.transforms);
  }
#endif
  // The transformed inputs are formed again (cheap, elementwise) rather than kept.
  ORRERY_ASSIGN_OR_RETURN(KdaTransformed x, ApplyKdaInputTransforms(p, in, options.transforms));
  ORRERY_RETURN_IF_ERROR(RunBackward(p, x.in, d_o, d_final_state, grads, saved, nullptr));
  return ChainKdaInputTransforms(p, in, x, options.transforms, grads);
}

Status KdaDecodeStep(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta, float scale, Tensor* state, Tensor* o) {
  KdaDecodeOptions options;
  options.scale = scale;
  return KdaDecodeStep(q, k, v, g, beta, options, state, o);
}

namespace {

// The CPU twin of the engine's decode step: the reference transforms, then the recurrent step on
// the rows' states gathered from the table and written back.
Status DecodeStepCpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta, const KdaDecodeOptions& options, float scale,
                     Tensor* state, Tensor* o) {
  const int64_t n = q.dim(0), h = q.dim(1), kd = q.dim(2), vd = v.dim(2);
  Tensor tq = q, tk = k, tg = g, tbeta = beta;
  if (options.transforms.any()) {
    KdaProblem p;
    p.batch = 1;
    p.tokens = n;
    p.heads = h;
    p.key_dim = kd;
    p.value_dim = vd;
    p.device = q.device();
    p.dtype = q.dtype();
    KdaInputs raw;
    ORRERY_ASSIGN_OR_RETURN(raw.q, q.Reshape({1, n, h, kd}));
    ORRERY_ASSIGN_OR_RETURN(raw.k, k.Reshape({1, n, h, kd}));
    ORRERY_ASSIGN_OR_RETURN(raw.v, v.Reshape({1, n, h, vd}));
    ORRERY_ASSIGN_OR_RETURN(raw.g, g.Reshape({1, n, h, kd}));
    ORRERY_ASSIGN_OR_RETURN(raw.beta, beta.Reshape({1, n, h}));
    raw.a_log = options.a_log;
    raw.dt_bias = options.dt_bias;
    ORRERY_RETURN_IF_ERROR(ValidateKdaTransformInputs(p, raw, options.transforms));
    ORRERY_ASSIGN_OR_RETURN(KdaTransformed x, ApplyKdaInputTransforms(p, raw, options.transforms));
    ORRERY_ASSIGN_OR_RETURN(tq, x.in.q.Reshape({n, h, kd}));
    ORRERY_ASSIGN_OR_RETURN(tk, x.in.k.Reshape({n, h, kd}));
    ORRERY_ASSIGN_OR_RETURN(tg, x.in.g.Reshape({n, h, kd}));
    ORRERY_ASSIGN_OR_RETURN(tbeta, x.in.beta.Reshape({n, h}));
  }
  if (!options.rows.defined()) {
    return cpu::KdaDecodeStepCpu(tq, tk, v, tg, tbeta, scale, state, o);
  }
  const int32_t* rows = options.rows.data<int32_t>();
  const int64_t table = state->dim(0), row_elems = h * kd * vd;
  const size_t row_bytes = static_cast<size_t>(row_elems) * DTypeSize(state->dtype());
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] >= table) {
      return InvalidArgumentError("kda decode: rows[" + std::to_string(i) +
                                  "] = " + std::to_string(rows[i]) +
                                  " is outside the state table [0, " + std::to_string(table) + ")");
    }
  }
  // Padding rows (negative) start from zeros and are not written back.
  Tensor gathered = Tensor::Zeros({n, h, kd, vd}, state->dtype());
  char* base = static_cast<char*>(state->raw_data());
  char* mine = static_cast<char*>(gathered.raw_data());
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] >= 0) std::memcpy(mine + i * row_bytes, base + rows[i] * row_bytes, row_bytes);
  }
  ORRERY_RETURN_IF_ERROR(cpu::KdaDecodeStepCpu(tq, tk, v, tg, tbeta, scale, &gathered, o));
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] >= 0) std::memcpy(base + rows[i] * row_bytes, mine + i * row_bytes, row_bytes);
  }
  return Status::OK();
}

}  // namespace

Status KdaDecodeStep(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta, const KdaDecodeOptions& options, Tensor* state,
                     Tensor* o) {
  PhaseScope phase("op.kda_decode");
  if (!q.defined() || !k.defined() || !v.defined() || !g.defined() || !beta.defined() ||
      state == nullptr || !state->defined() || o == nullptr) {
    return InvalidArgumentError("kda decode: q, k, v, g, beta and state must all be given");
  }
  if (q.ndim() != 3 || v.ndim() != 3) {
    return InvalidArgumentError("kda decode: " + Describe("q", q) + ", " + Describe("v", v) +
                                ", expected q [N, H, K] and v [N, H, V]");
  }
  const int64_t n = q.dim(0), h = q.dim(1), kd = q.dim(2), vd = v.dim(2);
  ORRERY_RETURN_IF_ERROR(ExpectShape("k", k, {n, h, kd}));
  ORRERY_RETURN_IF_ERROR(ExpectShape("v", v, {n, h, vd}));
  ORRERY_RETURN_IF_ERROR(ExpectShape("g", g, {n, h, kd}));
  ORRERY_RETURN_IF_ERROR(ExpectShape("beta", beta, {n, h}));
  const Device device = q.device();
  const Tensor& rows = options.rows;
  if (rows.defined()) {
    if (rows.dtype() != DType::kI32 || rows.shape() != Shape{n} || !(rows.device() == device)) {
      return InvalidArgumentError("kda decode: " + Describe("rows", rows) + ", expected i32[" +
                                  std::to_string(n) + "] on " + device.ToString());
    }
    if (state->ndim() != 4 || state->dim(1) != h || state->dim(2) != kd || state->dim(3) != vd) {
      return InvalidArgumentError("kda decode: " + Describe("state", *state) +
                                  ", expected a table [S, " + std::to_string(h) + ", " +
                                  std::to_string(kd) + ", " + std::to_string(vd) + "]");
    }
  } else {
    ORRERY_RETURN_IF_ERROR(ExpectShape("state", *state, {n, h, kd, vd}));
  }
  for (const Tensor* t : {&k, &v, &g, &beta, static_cast<const Tensor*>(state)}) {
    ORRERY_RETURN_IF_ERROR(ExpectSameDevice("decode input", *t, device));
  }
  KdaInputs as_inputs{q, k, v, g, beta, Tensor(), Tensor()};
  ORRERY_RETURN_IF_ERROR(CheckDTypes(as_inputs));
  const bool state_ok =
      state->dtype() == DType::kF32 || (q.dtype() == DType::kF64 && state->dtype() == DType::kF64);
  if (!state_ok) {
    return InvalidArgumentError("kda decode: " + Describe("state", *state) + ", expected f32");
  }
  if (!options.transforms.gate && (options.a_log.defined() || options.dt_bias.defined())) {
    return InvalidArgumentError("kda decode: a_log / dt_bias given but transforms.gate is off");
  }
  if (options.transforms.gate) {
    const DType param = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    const std::pair<const char*, std::pair<const Tensor*, Shape>> params[] = {
        {"a_log", {&options.a_log, {h}}}, {"dt_bias", {&options.dt_bias, {h * kd}}}};
    for (const auto& [name, t] : params) {
      if (t.first->defined() && (t.first->dtype() != param || t.first->shape() != t.second ||
                                 !(t.first->device() == device))) {
        return InvalidArgumentError("kda decode: " + Describe(name, *t.first) + ", expected " +
                                    std::string(DTypeName(param)) + ShapeToString(t.second) +
                                    " on " + device.ToString());
      }
    }
  }
  if (!o->defined() || o->shape() != v.shape() || o->dtype() != v.dtype() ||
      !(o->device() == device)) {
    ORRERY_ASSIGN_OR_RETURN(*o, Tensor::Allocate(v.shape(), v.dtype(), device));
  }
  const float s = options.scale > 0.0f
                      ? options.scale
                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(kd)));
  if (device.is_cpu()) return DecodeStepCpu(q, k, v, g, beta, options, s, state, o);
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::KdaDecodeStepCuda(q, k, v, g, beta, s, options, state, o);
#else
  return FailedPreconditionError("kda decode: inputs are on " + device.ToString() +
                                 " but this build has no CUDA kernels");
#endif
}

}  // namespace orrery::kernels
