// LmHeadPolicyLoss / LmHeadTokenLogprobs: checks, then per chunk of rows the logits product, the
// row-wise log-softmax and policy terms (CPU loop or CUDA kernel) and the two backward products.
#include "kernels/lm_head_policy_loss.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "kernels/elementwise_check.h"
#include "kernels/matmul.h"
#include "kernels/phase_profile.h"
#include "kernels/policy_token_terms.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "lm_head_policy_loss";

Status Bad(const std::string& what) { return InvalidArgumentError(std::string(kOp) + ": " + what); }

PolicyTokenCoefficients Coefficients(const LmHeadPolicyOptions& o) {
  PolicyTokenCoefficients c;
  c.lo = 1.0 - o.clip_low;
  c.hi = 1.0 + o.clip_high;
  c.entropy_coef = o.entropy_coef;
  c.kl_coef = o.kl_coef;
  return c;
}

// One chunk's rows on the CPU (the inputs' pointers already at the chunk's first row).
struct CpuRows {
  const int32_t* targets;
  const float *mask, *proximal, *weight, *advantage, *ref;  // the last four null without a loss
  float *logp, *entropy;                                    // null: not written
};

template <typename T>
Status RowsPolicyCpu(Tensor* logits, const CpuRows& in, int64_t row0, const LmHeadPolicyOptions& o,
                     bool loss, bool backward, PolicyRowSums* sums) {
  const int64_t rows = logits->dim(0), v = logits->dim(1);
  const double inv_t = 1.0 / o.temperature;
  const double scale = o.grad_scale * inv_t;
  const PolicyTokenCoefficients coef = Coefficients(o);
  for (int64_t r = 0; r < rows; ++r) {
    T* z = logits->data<T>() + r * v;
    if (in.logp != nullptr) in.logp[r] = 0.0f;
    if (in.entropy != nullptr) in.entropy[r] = 0.0f;
    if (in.mask[r] == 0.0f) {
      if (backward) std::fill(z, z + v, T(0));
      continue;
    }
    const int32_t t = in.targets[r];
    if (t < 0 || t >= v) {
      return OutOfRangeError(std::string(kOp) + ": targets[" + std::to_string(row0 + r) + "] = " +
                             std::to_string(t) + ", expected [0, " + std::to_string(v) + ")");
    }
    double mx = -INFINITY;
    for (int64_t i = 0; i < v; ++i) mx = std::max(mx, static_cast<double>(z[i]) * inv_t);
    double sum = 0, wsum = 0;
    for (int64_t i = 0; i < v; ++i) {
      const double zi = static_cast<double>(z[i]) * inv_t - mx;
      const double e = std::exp(zi);
      sum += e;
      wsum += e * zi;
    }
    const double lse = mx + std::log(sum);
    const double logp = static_cast<double>(z[t]) * inv_t - lse;
    const double entropy = std::log(sum) - wsum / sum;  // lse - Σ p z, the max shifted out
    if (in.logp != nullptr) in.logp[r] = static_cast<float>(logp);
    if (in.entropy != nullptr) in.entropy[r] = static_cast<float>(entropy);
    if (!loss) continue;
    const PolicyTokenTerms k =
        PolicyTerms(logp, entropy, in.proximal[r], in.weight[r], in.advantage[r],
                    in.ref != nullptr ? in.ref[r] : 0.0, coef);
    sums->loss_sum += k.loss;
    sums->tokens += 1;
    sums->clipped += k.clipped ? 1 : 0;
    sums->entropy_sum += entropy;
    sums->ratio_sum += k.ratio;
    sums->approx_kl_sum += k.approx_kl;
    sums->ref_kl_sum += k.ref_kl;
    if (!backward) continue;
    // d logp / dz_j = 1[j = y] - p_j;  d H / dz_j = -p_j (log p_j + H); d loss / dH = -β.
    for (int64_t i = 0; i < v; ++i) {
      const double lpi = static_cast<double>(z[i]) * inv_t - lse;
      const double p = std::exp(lpi);
      const double g = k.dlogp * ((i == t ? 1.0 : 0.0) - p) + o.entropy_coef * p * (lpi + entropy);
      z[i] = static_cast<T>(scale * g);
    }
  }
  return Status::OK();
}

// Both entry points: `loss` false is the forward-only pass (rows.targets and rows.mask only).
Status Run(const Tensor& x, const Tensor& w, const PolicyRows& rows, const LmHeadPolicyOptions& o,
           bool loss, PolicyRowSums* sums, Tensor* logp, Tensor* entropy, Tensor* dx, Tensor* dw) {
  PhaseScope phase("op.lm_head_policy_loss");
  ORRERY_RETURN_IF_ERROR(ExpectLmHeadOperands(kOp, x, w));
  const Device dev = x.device();
  const bool cpu = dev.is_cpu();
  const DType dt = x.dtype();
  const int64_t n = x.dim(0), v = w.dim(0);
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "targets", rows.targets, {n}, DType::kI32, dev));
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "mask", rows.mask, {n}, DType::kF32, dev));
  if (loss) {
    ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "proximal", rows.proximal, {n}, DType::kF32, dev));
    ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "weight", rows.weight, {n}, DType::kF32, dev));
    ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "advantage", rows.advantage, {n}, DType::kF32, dev));
    if (o.kl_coef > 0) {
      ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "ref", rows.ref, {n}, DType::kF32, dev));
    }
    if (!(o.clip_low > 0 && o.clip_low < 1) || !(o.clip_high > 0) || !(o.entropy_coef >= 0) ||
        !(o.kl_coef >= 0)) {
      return Bad("expected 0 < clip_low < 1, clip_high > 0, entropy_coef >= 0 and kl_coef >= 0");
    }
  }
  if (o.chunk_rows <= 0) return Bad("chunk_rows must be > 0");
  if (!(o.temperature > 0)) return Bad("temperature must be > 0");
  if (logp != nullptr) ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "logp", {n}, DType::kF32, dev, logp));
  if (entropy != nullptr) {
    ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "entropy", {n}, DType::kF32, dev, entropy));
  }
  const bool backward = dx != nullptr;
  if (backward) ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "dx", x, dx));
  if (dw != nullptr) {
    if (!backward) return Bad("dw needs dx (the backward)");
    if (!dw->defined()) return Bad("dw must be allocated (it is accumulated into)");
    ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "dw", w.shape(), cpu ? dt : DType::kF32, dev, dw));
  }
  if (sums != nullptr) *sums = PolicyRowSums();
  if (n == 0) return Status::OK();
#if !defined(ORRERY_KERNELS_CUDA)
  if (!cpu) return NoCuda(kOp, x);
#endif
  const int64_t chunk = std::min(o.chunk_rows, n);
  // The logits of one chunk: x's dtype on the cpu, f32 on cuda; dz in their place, except for
  // bf16, where dz is rounded into its own bf16 buffer for the products.
  ORRERY_ASSIGN_OR_RETURN(Tensor logits, Tensor::Allocate({chunk, v}, cpu ? dt : DType::kF32, dev));
  Tensor dz_buf;
  if (backward && !cpu && dt == DType::kBF16) {
    ORRERY_ASSIGN_OR_RETURN(dz_buf, Tensor::Allocate({chunk, v}, DType::kBF16, dev));
  }
  // cuda: the seven sums (f64 [7]) and the first bad target's row (i32 [1]) on the device.
  Tensor acc, flag;
  if (!cpu) {
    ORRERY_ASSIGN_OR_RETURN(acc, Tensor::Zeros({7}, DType::kF64).To(dev));
    ORRERY_ASSIGN_OR_RETURN(flag, Tensor::FromVector<int32_t>({1}, {INT_MAX}).To(dev));
  }
  auto slice = [](const Tensor& t, int64_t a, int64_t b) -> StatusOr<Tensor> {
    if (!t.defined()) return Tensor();
    return t.Slice(a, b);
  };
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t count = std::min(chunk, n - start);
    const int64_t end = start + count;
    ORRERY_ASSIGN_OR_RETURN(Tensor xc, x.Slice(start, end));
    ORRERY_ASSIGN_OR_RETURN(Tensor lc, logits.Slice(0, count));
    ORRERY_RETURN_IF_ERROR(Matmul(xc, w, {false, true, 1.0f, 0.0f}, &lc));
    PolicyRows rc;
    ORRERY_ASSIGN_OR_RETURN(rc.targets, slice(rows.targets, start, end));
    ORRERY_ASSIGN_OR_RETURN(rc.mask, slice(rows.mask, start, end));
    if (loss) {
      ORRERY_ASSIGN_OR_RETURN(rc.proximal, slice(rows.proximal, start, end));
      ORRERY_ASSIGN_OR_RETURN(rc.weight, slice(rows.weight, start, end));
      ORRERY_ASSIGN_OR_RETURN(rc.advantage, slice(rows.advantage, start, end));
      if (o.kl_coef > 0) {
        ORRERY_ASSIGN_OR_RETURN(rc.ref, slice(rows.ref, start, end));
      }
    }
    Tensor lpc, entc;
    if (logp != nullptr) {
      ORRERY_ASSIGN_OR_RETURN(lpc, logp->Slice(start, end));
    }
    if (entropy != nullptr) {
      ORRERY_ASSIGN_OR_RETURN(entc, entropy->Slice(start, end));
    }
    Tensor dzc = lc;
    if (dz_buf.defined()) {
      ORRERY_ASSIGN_OR_RETURN(dzc, dz_buf.Slice(0, count));
    }
    if (cpu) {
      auto f32 = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
      CpuRows in{rc.targets.data<int32_t>(), f32(rc.mask), f32(rc.proximal), f32(rc.weight),
                 f32(rc.advantage),          f32(rc.ref),  f32(lpc),         f32(entc)};
      ORRERY_RETURN_IF_ERROR(dt == DType::kF32
                                 ? RowsPolicyCpu<float>(&lc, in, start, o, loss, backward, sums)
                                 : RowsPolicyCpu<double>(&lc, in, start, o, loss, backward, sums));
    } else {
#if defined(ORRERY_KERNELS_CUDA)
      cuda::PolicyRowsArgs a;
      a.coef = Coefficients(o);
      a.inv_temperature = static_cast<float>(1.0 / o.temperature);
      a.scale = o.grad_scale / o.temperature;
      a.loss = loss;
      a.backward = backward;
      a.row0 = start;
      ORRERY_RETURN_IF_ERROR(cuda::RowsPolicyLossCuda(lc, rc, a, &dzc, &lpc, &entc, &acc, &flag));
#endif
    }
    if (!backward) continue;
    ORRERY_ASSIGN_OR_RETURN(Tensor dxc, dx->Slice(start, end));
    ORRERY_RETURN_IF_ERROR(Matmul(dzc, w, {false, false, 1.0f, 0.0f}, &dxc));
    if (dw != nullptr) ORRERY_RETURN_IF_ERROR(Matmul(dzc, xc, {true, false, 1.0f, 1.0f}, dw));
  }
  if (cpu) return Status::OK();
  // One read back: the sums and the flag (a synchronising copy each).
  ORRERY_ASSIGN_OR_RETURN(Tensor bad, flag.To(Device::Cpu()));
  const int32_t row = bad.data<int32_t>()[0];
  if (row != INT_MAX) {
    ORRERY_ASSIGN_OR_RETURN(Tensor t, rows.targets.Slice(row, row + 1));
    ORRERY_ASSIGN_OR_RETURN(Tensor th, t.To(Device::Cpu()));
    return OutOfRangeError(std::string(kOp) + ": targets[" + std::to_string(row) +
                           "] = " + std::to_string(th.data<int32_t>()[0]) + ", expected [0, " +
                           std::to_string(v) + ")");
  }
  if (loss && sums != nullptr) {
    ORRERY_ASSIGN_OR_RETURN(Tensor s, acc.To(Device::Cpu()));
    const double* p = s.data<double>();
    *sums = PolicyRowSums{p[0], p[1], p[2], p[3], p[4], p[5], p[6]};
  }
  return Status::OK();
}

}  // namespace

Status LmHeadPolicyLoss(const Tensor& x, const Tensor& w, const PolicyRows& rows,
                        const LmHeadPolicyOptions& options, PolicyRowSums* sums, Tensor* logp,
                        Tensor* dx, Tensor* dw) {
  if (sums == nullptr) return Bad("sums is required");
  return Run(x, w, rows, options, true, sums, logp, nullptr, dx, dw);
}

Status LmHeadTokenLogprobs(const Tensor& x, const Tensor& w, const Tensor& targets,
                           const Tensor& mask, const LmHeadPolicyOptions& options, Tensor* logp,
                           Tensor* entropy) {
  if (logp == nullptr) return Bad("logp is required");
  PolicyRows rows;
  rows.targets = targets;
  rows.mask = mask;
  return Run(x, w, rows, options, false, nullptr, logp, entropy, nullptr, nullptr);
}

}  // namespace orrery::kernels
