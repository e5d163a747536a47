// RouteTopK, RouteTopKGrad, MoeExperts, MoeExpertsGrad (kernels/moe.h): the argument checks, the
// per-expert products on row views through kernels::Matmul and kernels::Glu (the same on both
// devices), and the primitives on the CPU (kernels/cpu/moe_cpu.h) or CUDA (kernels/cuda/
// moe_cuda.h).
#include <algorithm>
#include <string>

#include "kernels/cpu/moe_cpu.h"
#include "kernels/elementwise_check.h"
#include "kernels/grouped_gemm.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/moe_cuda.h"
// The primitive on the tensors' device (the ops have refused cuda tensors in a CPU-only build).
#define ORRERY_MOE_DISPATCH(device, cpu_call, cuda_call) \
  ((device).is_cpu() ? (cpu_call) : (cuda::cuda_call))
#else
#define ORRERY_MOE_DISPATCH(device, cpu_call, cuda_call) (cpu_call)
#endif

namespace orrery::kernels {
namespace {

Status Bad(const char* op, const std::string& what) {
  return InvalidArgumentError(std::string(op) + ": " + what);
}

std::string Desc(const Tensor& t) { return t.defined() ? t.ToString() : "undefined"; }

Status CheckBuild(const char* op, const Tensor& t) {
#if defined(ORRERY_KERNELS_CUDA)
  (void)op;
  (void)t;
  return Status::OK();
#else
  return t.device().is_cpu() ? Status::OK() : NoCuda(op, t);
#endif
}

// scores [N, E]: f32, or f64 on cpu; 1 <= E <= kMaxExperts.
Status CheckScores(const char* op, const Tensor& scores) {
  const bool cpu = scores.defined() && scores.device().is_cpu();
  if (!scores.defined() || scores.ndim() != 2 ||
      !(scores.dtype() == DType::kF32 || (cpu && scores.dtype() == DType::kF64))) {
    return Bad(op, "scores " + Desc(scores) + ", expected 2-D f32 (or f64 on cpu)");
  }
  if (scores.dim(1) < 1 || scores.dim(1) > kMaxExperts) {
    return Bad(op, "scores " + scores.ToString() + ": expected 1 to " +
                       std::to_string(kMaxExperts) + " experts");
  }
  return CheckBuild(op, scores);
}

Status CheckTopK(const char* op, int64_t k, int64_t e) {
  const int64_t most = std::min(e, kMaxTopK);
  if (k < 1 || k > most) {
    return Bad(op, "top_k " + std::to_string(k) + ", expected 1 to " + std::to_string(most) +
                       " (min(E = " + std::to_string(e) + ", " + std::to_string(kMaxTopK) + "))");
  }
  return Status::OK();
}

// ids i32 [n, k] on `device` with a valid k.
Status CheckIds(const char* op, const Tensor& ids, int64_t n, int64_t e, Device device) {
  if (!ids.defined() || ids.ndim() != 2) return Bad(op, "ids " + Desc(ids) + ", expected 2-D");
  ORRERY_RETURN_IF_ERROR(CheckTopK(op, ids.dim(1), e));
  return ExpectAs(op, "ids", ids, {n, ids.dim(1)}, DType::kI32, device);
}

// One element of a device or host i32 tensor (an error path's read back).
StatusOr<int32_t> ElementOf(const Tensor& t, int64_t i) {
  ORRERY_ASSIGN_OR_RETURN(Tensor flat, t.Reshape({t.numel()}));
  ORRERY_ASSIGN_OR_RETURN(Tensor one, flat.Slice(i, i + 1));
  ORRERY_ASSIGN_OR_RETURN(Tensor host, one.To(Device::Cpu()));
  return host.data<int32_t>()[0];
}

// MoeLayer's message for the first bad id in forced row t.
Status ForcedError(const Tensor& forced, int64_t t, int64_t e) {
  const int64_t k = forced.dim(1);
  ORRERY_ASSIGN_OR_RETURN(Tensor one, forced.Slice(t, t + 1));
  ORRERY_ASSIGN_OR_RETURN(Tensor row_t, one.To(Device::Cpu()));
  const int32_t* row = row_t.data<int32_t>();
  for (int64_t j = 0; j < k; ++j) {
    if (row[j] < 0 || row[j] >= e) {
      return InvalidArgumentError("forced_experts: expert id " + std::to_string(row[j]) +
                                  " at token " + std::to_string(t) + " is outside [0, " +
                                  std::to_string(e) + ")");
    }
    if (std::find(row, row + j, row[j]) != row + j) {
      return InvalidArgumentError("forced_experts: expert " + std::to_string(row[j]) +
                                  " repeated at token " + std::to_string(t));
    }
  }
  return InternalError("route_topk: forced row " + std::to_string(t) + " was flagged but is valid");
}

Status BadExpertId(const char* op, const Tensor& ids, int64_t p, int64_t e) {
  ORRERY_ASSIGN_OR_RETURN(const int32_t id, ElementOf(ids, p));
  const int64_t k = ids.dim(1);
  return Bad(op, "ids[" + std::to_string(p / k) + ", " + std::to_string(p % k) +
                     "] = " + std::to_string(id) + ", expected [0, " + std::to_string(e) + ")");
}

// *out zero-filled with shape/dtype on device when undefined, else checked (an accumulator).
Status ZerosAs(const char* op, const char* name, const Shape& shape, DType dtype, Device device,
               Tensor* out) {
  if (out == nullptr) return Bad(op, std::string(name) + " is required");
  if (out->defined()) return ExpectAs(op, name, *out, shape, dtype, device);
  ORRERY_ASSIGN_OR_RETURN(*out, Tensor::Allocate(shape, dtype, device));
  return out->SetZero();
}

StatusOr<Tensor> New(const Shape& shape, DType dtype, Device device) {
  return Tensor::Allocate(shape, dtype, device);
}

// Expert e's matrix of a stacked [E, r, c] tensor, as an [r, c] view.
StatusOr<Tensor> ExpertOf(const Tensor& w, int64_t e) {
  ORRERY_ASSIGN_OR_RETURN(Tensor one, w.Slice(e, e + 1));
  return one.Reshape({w.dim(1), w.dim(2)});
}

// The sizes of an experts call, after its checks.
struct ExpertsDims {
  int64_t n, k, f, l;
  int64_t e;        // experts the ids index: all of them (with an exchange, the group's)
  int64_t e_local;  // experts in w1, w3, w2 (e without an exchange)
  Device device;
  DType dtype;       // xl, weights of the experts, activations
  DType route_type;  // weights: dtype on cpu, f32 on cuda
  DType grad_type;   // dtype on cpu, f32 on cuda
};

Status CheckExperts(const char* op, const Tensor& xl, const Tensor& ids, const Tensor& weights,
                    const Tensor& w1, const Tensor& w3, const Tensor& w2,
                    const ExpertExchange* exchange, ExpertsDims* d) {
  if (!xl.defined() || xl.ndim() != 2) return Bad(op, "xl " + Desc(xl) + ", expected 2-D");
  const bool cpu = xl.device().is_cpu();
  const DType dt = xl.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return Bad(op, "xl " + xl.ToString() +
                       (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  ORRERY_RETURN_IF_ERROR(CheckBuild(op, xl));
  if (!w1.defined() || w1.ndim() != 3 || w1.dim(2) != xl.dim(1)) {
    return Bad(op, "w1 " + Desc(w1) + ", expected [E, F, " + std::to_string(xl.dim(1)) + "]");
  }
  d->n = xl.dim(0);
  d->l = xl.dim(1);
  d->e_local = w1.dim(0);
  d->e = exchange != nullptr ? exchange->num_experts() : d->e_local;
  d->f = w1.dim(1);
  d->device = xl.device();
  d->dtype = dt;
  d->route_type = cpu ? dt : DType::kF32;
  d->grad_type = cpu ? dt : DType::kF32;
  if (d->e < 1 || d->e > kMaxExperts) {
    return Bad(op, "w1 " + w1.ToString() + ": expected 1 to " + std::to_string(kMaxExperts) +
                       " experts" + (exchange != nullptr ? " over the exchange's group" : ""));
  }
  if (exchange != nullptr &&
      (d->e_local != exchange->local_experts() || exchange->first_expert() < 0 ||
       exchange->first_expert() + d->e_local > d->e)) {
    return Bad(op, "w1 " + w1.ToString() + ": the exchange holds experts [" +
                       std::to_string(exchange->first_expert()) + ", " +
                       std::to_string(exchange->first_expert() + exchange->local_experts()) +
                       ") of " + std::to_string(d->e) + " on this rank");
  }
  ORRERY_RETURN_IF_ERROR(ExpectAs(op, "w1", w1, w1.shape(), dt, d->device));
  ORRERY_RETURN_IF_ERROR(ExpectAs(op, "w3", w3, w1.shape(), dt, d->device));
  ORRERY_RETURN_IF_ERROR(ExpectAs(op, "w2", w2, {d->e_local, d->l, d->f}, dt, d->device));
  ORRERY_RETURN_IF_ERROR(CheckIds(op, ids, d->n, d->e, d->device));
  d->k = ids.dim(1);
  return ExpectAs(op, "weights", weights, {d->n, d->k}, d->route_type, d->device);
}

// Whether the experts' products take the grouped GEMMs (kernels/moe.h): bf16 on cuda, dims the
// kernels take.
bool Grouped(const ExpertsDims& d, const MoeExpertsOptions& options) {
  return options.grouped_gemm && !d.device.is_cpu() && d.dtype == DType::kBF16 &&
         GroupedGemmSupports(d.f, d.l);
}

// Rows grouped by expert, in w1's expert order: offsets [experts + 1] on the host (the loop
// path) and, for the grouped GEMMs, the same on the device.
struct ExpertRows {
  const std::vector<int64_t>* host = nullptr;
  Tensor device;
};

// The experts' forward products over rows x [R, L] grouped by expert: a = x W1_e^T,
// u = x W3_e^T (both [R, F]) and o = glu(a, u) W2_e^T [R, L], into allocated tensors.
Status ExpertProducts(bool grouped, const Tensor& x, const ExpertRows& rows, const Tensor& w1,
                      const Tensor& w3, const Tensor& w2, const GluActivation& act, Tensor* a,
                      Tensor* u, Tensor* o) {
  if (grouped) {
    ORRERY_RETURN_IF_ERROR(GroupedGemmForward(x, w1, rows.device, a));
    ORRERY_RETURN_IF_ERROR(GroupedGemmForward(x, w3, rows.device, u));
    Tensor h;
    ORRERY_RETURN_IF_ERROR(Glu(act, *a, *u, &h));
    return GroupedGemmForward(h, w2, rows.device, o);
  }
  const std::vector<int64_t>& off = *rows.host;
  const MatmulOptions linear{false, true, 1.0f, 0.0f};  // rows x W^T, W [out, in]
  for (int64_t e = 0; e + 1 < static_cast<int64_t>(off.size()); ++e) {
    if (off[e + 1] == off[e]) continue;
    ORRERY_ASSIGN_OR_RETURN(const Tensor xe, x.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(Tensor ae, a->Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(Tensor ue, u->Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(const Tensor w1e, ExpertOf(w1, e));
    ORRERY_ASSIGN_OR_RETURN(const Tensor w3e, ExpertOf(w3, e));
    ORRERY_RETURN_IF_ERROR(Matmul(xe, w1e, linear, &ae));
    ORRERY_RETURN_IF_ERROR(Matmul(xe, w3e, linear, &ue));
  }
  Tensor h;
  ORRERY_RETURN_IF_ERROR(Glu(act, *a, *u, &h));
  for (int64_t e = 0; e + 1 < static_cast<int64_t>(off.size()); ++e) {
    if (off[e + 1] == off[e]) continue;
    ORRERY_ASSIGN_OR_RETURN(const Tensor he, h.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(Tensor oe, o->Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(const Tensor w2e, ExpertOf(w2, e));
    ORRERY_RETURN_IF_ERROR(Matmul(he, w2e, linear, &oe));
  }
  return Status::OK();
}

// The backward of ExpertProducts from doe [R, L]: dx [R, L] in `grad` dtype (allocated,
// overwritten); dw1, dw3, dw2 accumulated. h = glu(a, u) is recomputed.
Status ExpertProductsGrad(bool grouped, const Tensor& x, const Tensor& a, const Tensor& u,
                          const Tensor& doe, const ExpertRows& rows, const Tensor& w1,
                          const Tensor& w3, const Tensor& w2, const GluActivation& act, DType grad,
                          Tensor* dx, Tensor* dw1, Tensor* dw3, Tensor* dw2) {
  const Device dev = x.device();
  Tensor h, da, du;
  ORRERY_RETURN_IF_ERROR(Glu(act, a, u, &h));
  ORRERY_ASSIGN_OR_RETURN(Tensor dh, New(a.shape(), a.dtype(), dev));
  ORRERY_ASSIGN_OR_RETURN(*dx, New(x.shape(), grad, dev));
  if (grouped) {
    const Tensor& off = rows.device;
    ORRERY_RETURN_IF_ERROR(GroupedGemmInputGrad(doe, w2, off, false, &dh));
    ORRERY_RETURN_IF_ERROR(GroupedGemmWeightGrad(doe, h, off, dw2));
    ORRERY_RETURN_IF_ERROR(GluGrad(act, a, u, dh, &da, &du));
    ORRERY_RETURN_IF_ERROR(GroupedGemmInputGrad(da, w1, off, false, dx));
    ORRERY_RETURN_IF_ERROR(GroupedGemmInputGrad(du, w3, off, true, dx));
    ORRERY_RETURN_IF_ERROR(GroupedGemmWeightGrad(da, x, off, dw1));
    return GroupedGemmWeightGrad(du, x, off, dw3);
  }
  const std::vector<int64_t>& off = *rows.host;
  const int64_t experts = static_cast<int64_t>(off.size()) - 1;
  const MatmulOptions plain{false, false, 1.0f, 0.0f}, plain_acc{false, false, 1.0f, 1.0f};
  const MatmulOptions outer_acc{true, false, 1.0f, 1.0f};  // dW += dy^T x
  for (int64_t e = 0; e < experts; ++e) {
    if (off[e + 1] == off[e]) continue;
    ORRERY_ASSIGN_OR_RETURN(const Tensor doe_e, doe.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(const Tensor he, h.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(Tensor dh_e, dh.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(const Tensor w2e, ExpertOf(w2, e));
    ORRERY_ASSIGN_OR_RETURN(Tensor dw2e, ExpertOf(*dw2, e));
    ORRERY_RETURN_IF_ERROR(Matmul(doe_e, w2e, plain, &dh_e));
    ORRERY_RETURN_IF_ERROR(Matmul(doe_e, he, outer_acc, &dw2e));
  }
  ORRERY_RETURN_IF_ERROR(GluGrad(act, a, u, dh, &da, &du));
  for (int64_t e = 0; e < experts; ++e) {
    if (off[e + 1] == off[e]) continue;
    ORRERY_ASSIGN_OR_RETURN(const Tensor xe, x.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(const Tensor da_e, da.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(const Tensor du_e, du.Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(Tensor dxe, dx->Slice(off[e], off[e + 1]));
    ORRERY_ASSIGN_OR_RETURN(const Tensor w1e, ExpertOf(w1, e));
    ORRERY_ASSIGN_OR_RETURN(const Tensor w3e, ExpertOf(w3, e));
    ORRERY_ASSIGN_OR_RETURN(Tensor dw1e, ExpertOf(*dw1, e));
    ORRERY_ASSIGN_OR_RETURN(Tensor dw3e, ExpertOf(*dw3, e));
    ORRERY_RETURN_IF_ERROR(Matmul(da_e, w1e, plain, &dxe));
    ORRERY_RETURN_IF_ERROR(Matmul(du_e, w3e, plain_acc, &dxe));
    ORRERY_RETURN_IF_ERROR(Matmul(da_e, xe, outer_acc, &dw1e));
    ORRERY_RETURN_IF_ERROR(Matmul(du_e, xe, outer_acc, &dw3e));
  }
  return Status::OK();
}

// The owned rows' offsets on the device for the grouped GEMMs (i32), from the plan's host ones.
StatusOr<Tensor> OwnedOffsetsOn(const ExpertExchangePlan& plan, Device device) {
  std::vector<int32_t> off(plan.owned_offsets.begin(), plan.owned_offsets.end());
  return Tensor::FromVector<int32_t>({static_cast<int64_t>(off.size())}, off).To(device);
}

}  // namespace

Status RouteTopK(const Tensor& scores, const Tensor& bias, const Tensor& forced, int64_t top_k,
                 double routed_scale, Tensor* ids, Tensor* weights) {
  PhaseScope phase("op.route_topk");
  constexpr const char* kOp = "route_topk";
  ORRERY_RETURN_IF_ERROR(CheckScores(kOp, scores));
  const int64_t n = scores.dim(0), e = scores.dim(1);
  const Device dev = scores.device();
  ORRERY_RETURN_IF_ERROR(CheckTopK(kOp, top_k, e));
  if (bias.defined()) ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "bias", bias, {e}, DType::kF32, dev));
  if (forced.defined()) {
    ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "forced", forced, {n, top_k}, DType::kI32, dev));
  }
  if (ids == nullptr || weights == nullptr) return Bad(kOp, "ids and weights are required");
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "ids", {n, top_k}, DType::kI32, dev, ids));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "weights", {n, top_k}, scores.dtype(), dev, weights));
  if (n == 0) return Status::OK();
  int64_t bad = -1;
  ORRERY_RETURN_IF_ERROR(
      ORRERY_MOE_DISPATCH(dev, RouteTopKCpu(scores, bias, forced, routed_scale, ids, weights, &bad),
                          RouteTopKCuda(scores, bias, forced, routed_scale, ids, weights, &bad)));
  return bad >= 0 ? ForcedError(forced, bad, e) : Status::OK();
}

Status RouteTopKGrad(const Tensor& scores, const Tensor& ids, const Tensor& dweights,
                     double routed_scale, Tensor* dlogits) {
  PhaseScope phase("op.route_topk_grad");
  constexpr const char* kOp = "route_topk_backward";
  ORRERY_RETURN_IF_ERROR(CheckScores(kOp, scores));
  const int64_t n = scores.dim(0), e = scores.dim(1);
  const Device dev = scores.device();
  ORRERY_RETURN_IF_ERROR(CheckIds(kOp, ids, n, e, dev));
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "dweights", dweights, ids.shape(), scores.dtype(), dev));
  if (dlogits == nullptr) return Bad(kOp, "dlogits is required");
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dlogits", {n, e}, scores.dtype(), dev, dlogits));
  if (n == 0) return Status::OK();
  if (dev.is_cpu()) {
    const int32_t* id = ids.data<int32_t>();
    for (int64_t p = 0; p < ids.numel(); ++p) {
      if (id[p] < 0 || id[p] >= e) return BadExpertId(kOp, ids, p, e);
    }
  }
  return ORRERY_MOE_DISPATCH(dev, RouteTopKGradCpu(scores, ids, dweights, routed_scale, dlogits),
                             RouteTopKGradCuda(scores, ids, dweights, routed_scale, dlogits));
}

Status MoeExperts(const Tensor& xl, const Tensor& ids, const Tensor& weights, const Tensor& w1,
                  const Tensor& w3, const Tensor& w2, const GluActivation& act, Tensor* y,
                  MoeExpertsSaved* saved, const MoeExpertsOptions& options) {
  PhaseScope phase("op.moe_experts");
  constexpr const char* kOp = "moe_experts";
  ExpertExchange* exchange = options.exchange;
  ExpertsDims d;
  ORRERY_RETURN_IF_ERROR(CheckExperts(kOp, xl, ids, weights, w1, w3, w2, exchange, &d));
  if (y == nullptr) return Bad(kOp, "y is required");
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "y", {d.n, d.l}, d.dtype, d.device, y));
  MoeExpertsSaved local;
  MoeExpertsSaved& s = saved != nullptr ? *saved : local;
  s = MoeExpertsSaved();
  const int64_t m = d.n * d.k;
  ORRERY_ASSIGN_OR_RETURN(s.perm, New({m}, DType::kI32, d.device));
  ORRERY_ASSIGN_OR_RETURN(s.rank, New({d.n, d.k}, DType::kI32, d.device));
  ORRERY_ASSIGN_OR_RETURN(s.xg, New({m, d.l}, d.dtype, d.device));
  ORRERY_ASSIGN_OR_RETURN(s.o, New({m, d.l}, d.dtype, d.device));
  const bool grouped = Grouped(d, options);
  if (d.n == 0) {
    s.offsets.assign(static_cast<size_t>(d.e + 1), 0);
  } else {
    // The per-expert counts reach the host unless the grouped GEMMs run without an exchange.
    [[maybe_unused]] const bool host_counts = !grouped || exchange != nullptr;  // cuda only
    int64_t bad = -1;
    PhaseScope permute("op.moe_permute");
    ORRERY_RETURN_IF_ERROR(
        ORRERY_MOE_DISPATCH(d.device, MoePermuteCpu(ids, d.e, &s.perm, &s.rank, &s.offsets, &bad),
                            MoePermuteCuda(ids, d.e, &s.perm, &s.rank, &s.offsets_device,
                                           host_counts ? &s.offsets : nullptr, &bad)));
    permute.Stop();
    if (bad >= 0) return BadExpertId(kOp, ids, bad, d.e);
    PhaseScope gather("op.moe_gather");
    ORRERY_RETURN_IF_ERROR(ORRERY_MOE_DISPATCH(d.device, MoeGatherCpu(xl, s.perm, d.k, &s.xg),
                                               MoeGatherCuda(xl, s.perm, d.k, &s.xg)));
  }
  if (exchange == nullptr) {
    ORRERY_ASSIGN_OR_RETURN(s.a, New({m, d.f}, d.dtype, d.device));
    ORRERY_ASSIGN_OR_RETURN(s.u, New({m, d.f}, d.dtype, d.device));
    if (d.n == 0) return Status::OK();
    ORRERY_RETURN_IF_ERROR(ExpertProducts(grouped, s.xg, {&s.offsets, s.offsets_device}, w1, w3, w2,
                                          act, &s.a, &s.u, &s.o));
  } else {
    // Dispatch, the local experts' products, combine (kernels/expert_exchange.h). Collective:
    // a rank without tokens still takes part.
    ORRERY_ASSIGN_OR_RETURN(s.plan, exchange->Plan(s.offsets));
    Tensor owned;
    ORRERY_RETURN_IF_ERROR(exchange->ToOwners(s.xg, s.plan, &owned));
    s.xg = owned;
    const int64_t rows = s.plan.owned_offsets.back();
    ORRERY_ASSIGN_OR_RETURN(s.a, New({rows, d.f}, d.dtype, d.device));
    ORRERY_ASSIGN_OR_RETURN(s.u, New({rows, d.f}, d.dtype, d.device));
    ORRERY_ASSIGN_OR_RETURN(Tensor o_owned, New({rows, d.l}, d.dtype, d.device));
    ExpertRows local_rows{&s.plan.owned_offsets, Tensor()};
    if (grouped) {
      ORRERY_ASSIGN_OR_RETURN(local_rows.device, OwnedOffsetsOn(s.plan, d.device));
    }
    ORRERY_RETURN_IF_ERROR(
        ExpertProducts(grouped, s.xg, local_rows, w1, w3, w2, act, &s.a, &s.u, &o_owned));
    ORRERY_RETURN_IF_ERROR(exchange->FromOwners(o_owned, s.plan, &s.o));
    if (d.n == 0) return Status::OK();
  }
  PhaseScope combine("op.moe_combine");
  return ORRERY_MOE_DISPATCH(d.device, MoeCombineCpu(s.o, weights, s.perm, d.k, y),
                             MoeCombineCuda(s.o, weights, s.rank, y));
}

Status MoeExpertsGrad(const Tensor& xl, const Tensor& ids, const Tensor& weights, const Tensor& w1,
                      const Tensor& w3, const Tensor& w2, const GluActivation& act,
                      const MoeExpertsSaved& saved, const Tensor& dy, Tensor* dxl, Tensor* dweights,
                      Tensor* dw1, Tensor* dw3, Tensor* dw2, const MoeExpertsOptions& options) {
  PhaseScope phase("op.moe_experts_grad");
  constexpr const char* kOp = "moe_experts_backward";
  ExpertExchange* exchange = options.exchange;
  ExpertsDims d;
  ORRERY_RETURN_IF_ERROR(CheckExperts(kOp, xl, ids, weights, w1, w3, w2, exchange, &d));
  const int64_t m = d.n * d.k;
  const Device dev = d.device;
  const bool host_offsets = static_cast<int64_t>(saved.offsets.size()) == d.e + 1;
  const bool device_offsets =
      !dev.is_cpu() &&
      ExpectAs(kOp, "saved.offsets_device", saved.offsets_device, {d.e + 1}, DType::kI32, dev).ok();
  const bool planned =
      exchange != nullptr && static_cast<int64_t>(saved.plan.owned_offsets.size()) == d.e_local + 1;
  // The rows the experts' products ran over: this rank's pairs, or those its experts received.
  const int64_t rows = exchange != nullptr && planned ? saved.plan.owned_offsets.back() : m;
  const bool grouped = Grouped(d, options) && (device_offsets || exchange != nullptr);
  if (!(host_offsets || device_offsets) || (exchange != nullptr && !planned) ||
      !ExpectAs(kOp, "saved.perm", saved.perm, {m}, DType::kI32, dev).ok() ||
      !ExpectAs(kOp, "saved.rank", saved.rank, {d.n, d.k}, DType::kI32, dev).ok() ||
      !ExpectAs(kOp, "saved.xg", saved.xg, {rows, d.l}, d.dtype, dev).ok() ||
      !ExpectAs(kOp, "saved.a", saved.a, {rows, d.f}, d.dtype, dev).ok() ||
      !ExpectAs(kOp, "saved.u", saved.u, {rows, d.f}, d.dtype, dev).ok() ||
      !ExpectAs(kOp, "saved.o", saved.o, {m, d.l}, d.dtype, dev).ok()) {
    return Bad(kOp, "saved does not hold the state of a MoeExperts call on these inputs");
  }
  const DType g = d.grad_type;
  const bool dy_ok = dy.defined() && (dy.dtype() == d.dtype || dy.dtype() == g);
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "dy", dy, {d.n, d.l}, dy_ok ? dy.dtype() : d.dtype, dev));
  ORRERY_RETURN_IF_ERROR(ZerosAs(kOp, "dxl", {d.n, d.l}, g, dev, dxl));
  if (dweights == nullptr) return Bad(kOp, "dweights is required");
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dweights", {d.n, d.k}, g, dev, dweights));
  ORRERY_RETURN_IF_ERROR(ZerosAs(kOp, "dw1", w1.shape(), g, dev, dw1));
  ORRERY_RETURN_IF_ERROR(ZerosAs(kOp, "dw3", w1.shape(), g, dev, dw3));
  ORRERY_RETURN_IF_ERROR(ZerosAs(kOp, "dw2", w2.shape(), g, dev, dw2));
  if (d.n == 0 && exchange == nullptr) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(Tensor doe, New({m, d.l}, d.dtype, dev));
  if (d.n > 0) {
    PhaseScope combine_grad("op.moe_combine_grad");
    ORRERY_RETURN_IF_ERROR(ORRERY_MOE_DISPATCH(
        dev, MoeCombineGradCpu(dy, saved.o, weights, saved.perm, d.k, &doe, dweights),
        MoeCombineGradCuda(dy, saved.o, weights, saved.perm, d.k, &doe, dweights)));
  }
  Tensor dxg;
  if (exchange == nullptr) {
    std::vector<int64_t> read_back;
    if (!grouped && !host_offsets) {
      ORRERY_ASSIGN_OR_RETURN(const Tensor host, saved.offsets_device.To(Device::Cpu()));
      read_back.assign(host.data<int32_t>(), host.data<int32_t>() + d.e + 1);
    }
    const ExpertRows expert_rows{host_offsets ? &saved.offsets : &read_back, saved.offsets_device};
    ORRERY_RETURN_IF_ERROR(ExpertProductsGrad(grouped, saved.xg, saved.a, saved.u, doe, expert_rows,
                                              w1, w3, w2, act, g, &dxg, dw1, dw3, dw2));
  } else {
    Tensor doe_owned, dxg_owned;
    ORRERY_RETURN_IF_ERROR(exchange->ToOwners(doe, saved.plan, &doe_owned));
    ExpertRows local_rows{&saved.plan.owned_offsets, Tensor()};
    if (grouped) {
      ORRERY_ASSIGN_OR_RETURN(local_rows.device, OwnedOffsetsOn(saved.plan, dev));
    }
    ORRERY_RETURN_IF_ERROR(ExpertProductsGrad(grouped, saved.xg, saved.a, saved.u, doe_owned,
                                              local_rows, w1, w3, w2, act, g, &dxg_owned, dw1, dw3,
                                              dw2));
    ORRERY_RETURN_IF_ERROR(exchange->FromOwners(dxg_owned, saved.plan, &dxg));
    if (d.n == 0) return Status::OK();
  }
  PhaseScope scatter_add("op.moe_scatter_add");
  return ORRERY_MOE_DISPATCH(dev, MoeScatterAddCpu(dxg, saved.perm, d.k, dxl),
                             MoeScatterAddCuda(dxg, saved.rank, dxl));
}

}  // namespace orrery::kernels
