// The row-wise log-softmax and decoupled-PPO terms of the fused LM head + policy loss
// (kernels/lm_head_policy_loss.h): one block of 256 threads per logits row, passes over the row in
// f32 — the max, then the sums of exponentials and of their weighted exponents (the entropy) —
// then one thread takes the token terms in f64 (kernels/policy_token_terms.h, the CPU twin's own
// function) and (backward) every thread writes dz over the logits or into a bf16 buffer. Each
// row's seven terms go to its row of an f64 [rows, 7] scratch (zeros for a row without a loss),
// and LaunchColumnSums (column_sums.h) adds the chunk's rows into the accumulators in an order
// fixed by the row count: the same bits on every run.
// Not yet timed: correct first (issue 26).
#include <climits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

constexpr int kThreads = 256;

struct RowPointers {
  const int32_t* targets;
  const float *mask, *proximal, *weight, *advantage, *ref;  // the last four null without a loss
  float *logp, *entropy;                                    // null: not written
};

// terms: [rows, kTerms] (PolicyRowSums' order), written when args.loss.
constexpr int kTerms = 7;

template <typename D>
__global__ void RowsPolicyKernel(float* logits, RowPointers p, int64_t v, PolicyRowsArgs args,
                                 D* dz, double* terms, int* flag) {
  __shared__ float scratch[kThreads / 32];
  __shared__ double dlogp;
  const int64_t r = blockIdx.x;
  const float* z = logits + r * v;
  D* out = dz + r * v;
  const float m = p.mask[r];
  const int32_t t = p.targets[r];
  if (m == 0.0f || t < 0 || t >= v) {
    if (threadIdx.x == 0) {
      // An exact integer minimum: the same whatever the order of the rows.
      if (m != 0.0f) atomicMin(flag, static_cast<int>(args.row0 + r));
      if (p.logp != nullptr) p.logp[r] = 0.0f;
      if (p.entropy != nullptr) p.entropy[r] = 0.0f;
      if (args.loss) {
        for (int i = 0; i < kTerms; ++i) terms[r * kTerms + i] = 0.0;
      }
    }
    if (args.backward) {
      for (int64_t i = threadIdx.x; i < v; i += kThreads) out[i] = FromF<D>(0.0f);
    }
    return;
  }
  const float inv_t = args.inv_temperature;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) mx = fmaxf(mx, z[i] * inv_t);
  mx = BlockReduce<true, kThreads>(mx, scratch);
  float sum = 0.0f, wsum = 0.0f;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float zi = z[i] * inv_t - mx;
    const float e = expf(zi);
    sum += e;
    wsum += e * zi;
  }
  sum = BlockReduce<false, kThreads>(sum, scratch);
  wsum = BlockReduce<false, kThreads>(wsum, scratch);
  const float lse = mx + logf(sum);
  const double logp = static_cast<double>(z[t] * inv_t) - (mx + log(static_cast<double>(sum)));
  const double entropy = log(static_cast<double>(sum)) - static_cast<double>(wsum) / sum;
  __syncthreads();  // z[t] is read by every thread before the backward overwrites the row
  if (threadIdx.x == 0) {
    if (p.logp != nullptr) p.logp[r] = static_cast<float>(logp);
    if (p.entropy != nullptr) p.entropy[r] = static_cast<float>(entropy);
    if (args.loss) {
      const PolicyTokenTerms k =
          PolicyTerms(logp, entropy, p.proximal[r], p.weight[r], p.advantage[r],
                      p.ref != nullptr ? p.ref[r] : 0.0, args.coef);
      double* tr = terms + r * kTerms;
      tr[0] = k.loss;
      tr[1] = 1.0;
      tr[2] = k.clipped ? 1.0 : 0.0;
      tr[3] = entropy;
      tr[4] = k.ratio;
      tr[5] = k.approx_kl;
      tr[6] = args.coef.kl_coef > 0 ? k.ref_kl : 0.0;
      dlogp = k.dlogp;
    }
  }
  if (!args.loss || !args.backward) return;
  __syncthreads();
  const float gs = static_cast<float>(args.scale * dlogp);
  const float bs = static_cast<float>(args.scale * args.coef.entropy_coef);
  const float h = static_cast<float>(entropy);
  // d logp / dz_j = 1[j = y] - p_j;  d H / dz_j = -p_j (log p_j + H); d loss / dH = -β.
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float lpi = z[i] * inv_t - lse;
    const float pi = expf(lpi);
    out[i] = FromF<D>(gs * ((i == t ? 1.0f : 0.0f) - pi) + bs * pi * (lpi + h));
  }
}

const float* F32OrNull(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
float* F32OrNull(Tensor* t) { return t != nullptr && t->defined() ? t->data<float>() : nullptr; }

}  // namespace

Status RowsPolicyLossCuda(const Tensor& logits, const PolicyRows& rows, const PolicyRowsArgs& args,
                          Tensor* dz, Tensor* logp, Tensor* entropy, Tensor* acc, Tensor* flag) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(logits.device().index));
  const int64_t n = logits.dim(0), v = logits.dim(1);
  RowPointers p{rows.targets.data<int32_t>(),
                F32OrNull(rows.mask),
                F32OrNull(rows.proximal),
                F32OrNull(rows.weight),
                F32OrNull(rows.advantage),
                F32OrNull(rows.ref),
                F32OrNull(logp),
                F32OrNull(entropy)};
  float* z = static_cast<float*>(logits.raw_data());
  const unsigned blocks = static_cast<unsigned>(n);
  Tensor terms;
  if (args.loss) {
    ORRERY_ASSIGN_OR_RETURN(terms, Tensor::Allocate({n, kTerms}, DType::kF64, logits.device()));
  }
  double* tp = args.loss ? terms.data<double>() : nullptr;
  if (dz->dtype() == DType::kBF16) {
    RowsPolicyKernel<__nv_bfloat16><<<blocks, kThreads, 0, ctx->stream()>>>(
        z, p, v, args, static_cast<__nv_bfloat16*>(dz->raw_data()), tp, flag->data<int32_t>());
  } else {
    RowsPolicyKernel<float><<<blocks, kThreads, 0, ctx->stream()>>>(
        z, p, v, args, static_cast<float*>(dz->raw_data()), tp, flag->data<int32_t>());
  }
  ORRERY_RETURN_IF_ERROR(LastLaunchStatus("RowsPolicyKernel"));
  if (!args.loss) return Status::OK();
  return LaunchColumnSums(tp, n, kTerms, true, acc->data<double>(), ctx->stream());
}

}  // namespace orrery::kernels::cuda
