// CausalAttention / CausalAttentionGrad: checks, then the CPU templates (kernels/mla_attention.h)
// or CUDA, with the kernel set ORRERY_ATTENTION names (kernels/attention.h).
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/elementwise_check.h"
#include "kernels/mla_attention.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "causal_attention";

std::string Describe(const Tensor& t) { return t.defined() ? t.ToString() : "undefined"; }

// q [N, H, dqk] of a supported dtype, k like q, v [N, H, dv] of q's dtype and device, cu_seqlens
// i64 [docs + 1] on q's device (its values too on cpu).
Status CheckInputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu) {
  if (!q.defined() || q.ndim() != 3 || q.dim(2) < 1) {
    return InvalidArgumentError(std::string(kOp) + ": q " + Describe(q) +
                                ", expected [tokens, heads, qk_dim >= 1]");
  }
  const bool cpu = q.device().is_cpu();
  const DType dt = q.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(kOp) + ": q " + q.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "k", k, q));
  if (!v.defined() || v.ndim() != 3 || v.dim(2) < 1) {
    return InvalidArgumentError(std::string(kOp) + ": v " + Describe(v) + ", expected " +
                                std::string(DTypeName(dt)) + "[" + std::to_string(q.dim(0)) + ", " +
                                std::to_string(q.dim(1)) + ", v_dim >= 1] on " +
                                q.device().ToString());
  }
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "v", v, {q.dim(0), q.dim(1), v.dim(2)}, dt, q.device()));
  if (!cpu && (q.dim(2) > kMaxAttentionHeadDimCuda || v.dim(2) > kMaxAttentionHeadDimCuda)) {
    return InvalidArgumentError(std::string(kOp) + ": qk_dim " + std::to_string(q.dim(2)) +
                                ", v_dim " + std::to_string(v.dim(2)) + ", expected <= " +
                                std::to_string(kMaxAttentionHeadDimCuda) + " on cuda");
  }
  if (!cu.defined() || cu.ndim() != 1 || cu.dim(0) < 1 || cu.dtype() != DType::kI64 ||
      !(cu.device() == q.device())) {
    return InvalidArgumentError(std::string(kOp) + ": cu_seqlens " + Describe(cu) +
                                ", expected i64[docs + 1] on " + q.device().ToString());
  }
  if (cpu) {
    const int64_t* c = cu.data<int64_t>();
    const int64_t docs = cu.dim(0) - 1;
    bool ok = c[0] == 0 && c[docs] == q.dim(0);
    for (int64_t d = 0; ok && d < docs; ++d) ok = c[d] <= c[d + 1];
    if (!ok) {
      return InvalidArgumentError(std::string(kOp) +
                                  ": cu_seqlens must rise from 0 to the token count " +
                                  std::to_string(q.dim(0)) + " without falling");
    }
  }
  return Status::OK();
}

DType LseType(const Tensor& q) { return q.device().is_cpu() ? q.dtype() : DType::kF32; }

AttentionShape ShapeOf(const Tensor& q, const Tensor& v) {
  return {q.dim(0), q.dim(1), q.dim(2), v.dim(2)};
}

#if defined(ORRERY_KERNELS_CUDA)
// The CUDA kernel set ORRERY_ATTENTION names: unset or empty the fastest, else wgmma, mma or simt.
StatusOr<cuda::AttentionKernels> KernelsFromEnv(const char* op) {
  const char* env = std::getenv("ORRERY_ATTENTION");
  const std::string name = env == nullptr ? "" : env;
  if (name.empty()) return cuda::AttentionKernels::kFastest;
  if (name == "wgmma") return cuda::AttentionKernels::kWgmma;
  if (name == "mma") return cuda::AttentionKernels::kMma;
  if (name == "simt") return cuda::AttentionKernels::kSimt;
  return InvalidArgumentError(std::string(op) + ": ORRERY_ATTENTION=" + name +
                              ", expected wgmma, mma or simt (or unset)");
}
#endif

std::vector<int64_t> Offsets(const Tensor& cu) {
  return std::vector<int64_t>(cu.data<int64_t>(), cu.data<int64_t>() + cu.numel());
}

template <typename T>
void ForwardCpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, double scale,
                Tensor* o, Tensor* lse) {
  CausalAttentionForward<T>(ShapeOf(q, v), Offsets(cu), scale, q.data<T>(), k.data<T>(),
                            v.data<T>(), o->data<T>(), lse->data<T>());
}

template <typename T>
void BackwardCpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                 const Tensor& lse, const Tensor& d_o, const Tensor& cu, double scale, Tensor* dq,
                 Tensor* dk, Tensor* dv) {
  CausalAttentionBackward<T>(ShapeOf(q, v), Offsets(cu), scale, q.data<T>(), k.data<T>(),
                             v.data<T>(), o.data<T>(), lse.data<T>(), d_o.data<T>(), dq->data<T>(),
                             dk->data<T>(), dv->data<T>());
}

constexpr const char* kPrefixOp = "prefix_causal_attention";

// PrefixCausalAttention's inputs: q [Nq, H, dqk] of a supported dtype, k [Nk, H, dqk] and v
// [Nk, H, dv] of q's dtype and device, cu_q and cu_k i64 [docs + 1] on q's device (on cpu their
// values too: rising from 0 to Nq and Nk, n_d <= L_d).
Status CheckPrefixInputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                         const Tensor& cu_k) {
  const std::string op = kPrefixOp;
  if (!q.defined() || q.ndim() != 3 || q.dim(2) < 1) {
    return InvalidArgumentError(op + ": q " + Describe(q) +
                                ", expected [q_tokens, heads, qk_dim >= 1]");
  }
  const bool cpu = q.device().is_cpu();
  const DType dt = q.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        op + ": q " + q.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  if (!k.defined() || k.ndim() != 3) {
    return InvalidArgumentError(op + ": k " + Describe(k) + ", expected " +
                                std::string(DTypeName(dt)) + "[k_tokens, " +
                                std::to_string(q.dim(1)) + ", " + std::to_string(q.dim(2)) +
                                "] on " + q.device().ToString());
  }
  const int64_t nk = k.dim(0);
  ORRERY_RETURN_IF_ERROR(ExpectAs(kPrefixOp, "k", k, {nk, q.dim(1), q.dim(2)}, dt, q.device()));
  if (!v.defined() || v.ndim() != 3 || v.dim(2) < 1) {
    return InvalidArgumentError(op + ": v " + Describe(v) + ", expected " +
                                std::string(DTypeName(dt)) + "[" + std::to_string(nk) + ", " +
                                std::to_string(q.dim(1)) + ", v_dim >= 1] on " +
                                q.device().ToString());
  }
  ORRERY_RETURN_IF_ERROR(ExpectAs(kPrefixOp, "v", v, {nk, q.dim(1), v.dim(2)}, dt, q.device()));
  if (!cpu && (q.dim(2) > kMaxAttentionHeadDimCuda || v.dim(2) > kMaxAttentionHeadDimCuda)) {
    return InvalidArgumentError(
        op + ": qk_dim " + std::to_string(q.dim(2)) + ", v_dim " + std::to_string(v.dim(2)) +
        ", expected <= " + std::to_string(kMaxAttentionHeadDimCuda) + " on cuda");
  }
  for (const auto& [name, cu] : {std::pair<const char*, const Tensor&>{"cu_q", cu_q},
                                 std::pair<const char*, const Tensor&>{"cu_k", cu_k}}) {
    if (!cu.defined() || cu.ndim() != 1 || cu.dim(0) < 1 || cu.dtype() != DType::kI64 ||
        !(cu.device() == q.device())) {
      return InvalidArgumentError(op + ": " + name + " " + Describe(cu) +
                                  ", expected i64[docs + 1] on " + q.device().ToString());
    }
  }
  if (cu_q.dim(0) != cu_k.dim(0)) {
    return InvalidArgumentError(op + ": cu_q has " + std::to_string(cu_q.dim(0)) +
                                " offsets and cu_k " + std::to_string(cu_k.dim(0)) +
                                ", expected one per document boundary in both");
  }
  return cpu ? CheckPrefixOffsets(cu_q, cu_k, q.dim(0), nk) : Status::OK();
}

template <typename T>
void PrefixForwardCpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                      const Tensor& cu_k, double scale, Tensor* o, Tensor* lse) {
  const PrefixAttentionShape s{q.dim(0), k.dim(0), q.dim(1), q.dim(2), v.dim(2)};
  PrefixCausalAttentionForward<T>(s, Offsets(cu_q), Offsets(cu_k), scale, q.data<T>(), k.data<T>(),
                                  v.data<T>(), o->data<T>(), lse->data<T>());
}

}  // namespace

Status CheckPrefixOffsets(const Tensor& cu_q, const Tensor& cu_k, int64_t q_tokens,
                          int64_t k_tokens) {
  const std::string op = kPrefixOp;
  for (const auto& [name, cu] : {std::pair<const char*, const Tensor&>{"cu_q", cu_q},
                                 std::pair<const char*, const Tensor&>{"cu_k", cu_k}}) {
    if (!cu.defined() || cu.ndim() != 1 || cu.dim(0) < 1 || cu.dtype() != DType::kI64 ||
        !cu.device().is_cpu()) {
      return InvalidArgumentError(op + ": " + name + " " + Describe(cu) +
                                  ", expected i64[docs + 1] on cpu");
    }
  }
  if (cu_q.dim(0) != cu_k.dim(0)) {
    return InvalidArgumentError(op + ": cu_q has " + std::to_string(cu_q.dim(0)) +
                                " offsets and cu_k " + std::to_string(cu_k.dim(0)) +
                                ", expected one per document boundary in both");
  }
  const int64_t* cq = cu_q.data<int64_t>();
  const int64_t* ck = cu_k.data<int64_t>();
  const int64_t docs = cu_q.dim(0) - 1;
  bool ok = cq[0] == 0 && ck[0] == 0 && cq[docs] == q_tokens && ck[docs] == k_tokens;
  for (int64_t d = 0; ok && d < docs; ++d) ok = cq[d] <= cq[d + 1] && ck[d] <= ck[d + 1];
  if (!ok) {
    return InvalidArgumentError(op + ": cu_q and cu_k must rise from 0 to the query count " +
                                std::to_string(q_tokens) + " and the key count " +
                                std::to_string(k_tokens) + " without falling");
  }
  for (int64_t d = 0; d < docs; ++d) {
    if (cq[d + 1] - cq[d] > ck[d + 1] - ck[d]) {
      return InvalidArgumentError(op + ": document " + std::to_string(d) + " has " +
                                  std::to_string(cq[d + 1] - cq[d]) + " queries but " +
                                  std::to_string(ck[d + 1] - ck[d]) +
                                  " keys, expected queries <= keys (the queries are the last "
                                  "positions of the context)");
    }
  }
  return Status::OK();
}

Status PrefixCausalAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                             const Tensor& cu_k, double scale, Tensor* o, Tensor* lse) {
  PhaseScope phase("op.prefix_attention");
  ORRERY_RETURN_IF_ERROR(CheckPrefixInputs(q, k, v, cu_q, cu_k));
  ORRERY_RETURN_IF_ERROR(
      AllocateAs(kPrefixOp, "o", {q.dim(0), q.dim(1), v.dim(2)}, v.dtype(), q.device(), o));
  ORRERY_RETURN_IF_ERROR(
      AllocateAs(kPrefixOp, "lse", {q.dim(0), q.dim(1)}, LseType(q), q.device(), lse));
  if (q.dim(0) == 0 || q.dim(1) == 0) return Status::OK();
  if (q.device().is_cpu()) {
    if (q.dtype() == DType::kF32) {
      PrefixForwardCpu<float>(q, k, v, cu_q, cu_k, scale, o, lse);
    } else {
      PrefixForwardCpu<double>(q, k, v, cu_q, cu_k, scale, o, lse);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  ORRERY_ASSIGN_OR_RETURN(const cuda::AttentionKernels kernels, KernelsFromEnv(kPrefixOp));
  return cuda::PrefixCausalAttentionForwardCuda(q, k, v, cu_q, cu_k, scale, o, lse, kernels);
#else
  return NoCuda(kPrefixOp, q);
#endif
}

Status CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                       double scale, Tensor* o, Tensor* lse) {
  PhaseScope phase("op.attention");
  ORRERY_RETURN_IF_ERROR(CheckInputs(q, k, v, cu_seqlens));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "o", v, o));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "lse", {q.dim(0), q.dim(1)}, LseType(q), q.device(), lse));
  if (q.dim(0) == 0 || q.dim(1) == 0) return Status::OK();
  if (q.device().is_cpu()) {
    if (q.dtype() == DType::kF32) {
      ForwardCpu<float>(q, k, v, cu_seqlens, scale, o, lse);
    } else {
      ForwardCpu<double>(q, k, v, cu_seqlens, scale, o, lse);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  ORRERY_ASSIGN_OR_RETURN(const cuda::AttentionKernels kernels, KernelsFromEnv(kOp));
  return cuda::CausalAttentionForwardCuda(q, k, v, cu_seqlens, scale, o, lse, kernels);
#else
  return NoCuda(kOp, q);
#endif
}

Status CausalAttentionGrad(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                           const Tensor& lse, const Tensor& d_o, const Tensor& cu_seqlens,
                           double scale, Tensor* dq, Tensor* dk, Tensor* dv) {
  PhaseScope phase("op.attention_grad");
  ORRERY_RETURN_IF_ERROR(CheckInputs(q, k, v, cu_seqlens));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "o", o, v));
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "lse", lse, {q.dim(0), q.dim(1)}, LseType(q), q.device()));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "d_o", d_o, v));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dq", q, dq));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dk", k, dk));
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dv", v, dv));
  if (q.dim(0) == 0 || q.dim(1) == 0) return Status::OK();
  if (q.device().is_cpu()) {
    if (q.dtype() == DType::kF32) {
      BackwardCpu<float>(q, k, v, o, lse, d_o, cu_seqlens, scale, dq, dk, dv);
    } else {
      BackwardCpu<double>(q, k, v, o, lse, d_o, cu_seqlens, scale, dq, dk, dv);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  ORRERY_ASSIGN_OR_RETURN(const cuda::AttentionKernels kernels, KernelsFromEnv(kOp));
  return cuda::CausalAttentionBackwardCuda(q, k, v, o, lse, d_o, cu_seqlens, scale, dq, dk, dv,
                                           kernels);
#else
  return NoCuda(kOp, q);
#endif
}

}  // namespace orrery::kernels
