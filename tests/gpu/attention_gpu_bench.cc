// Times the causal attention op (kernels/attention.h) on the GPU with CUDA events: the median of
// 10 runs after 2 warm-ups, on random bf16 inputs (tests/gpu/gpu_bench_util.h), for the
// tensor-core kernels (the default dispatch: attention_forward_tc.cu, attention_backward_tc.cu)
// and the SIMT kernels (AttentionKernels::kSimt) on the same inputs. The case is one packed batch
// of 4 documents of 8192 tokens, 16 heads, with the model's full-size head (qk 192, v 128) and the
// square 128/128 head. Prints one line per kernel set and pass with its causal TFLOP/s: the
// forward's 2 products cost 2 T^2/2 (dqk + dv) FLOPs per document and head, the backward's 5 (dq,
// dk, dv and the recomputed S and dP) 2 T^2/2 (3 dqk + 2 dv); work a kernel adds (a separate dq
// pass recomputing S and dP) is not counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/ops_cuda.h"
#include "tests/gpu/gpu_bench_util.h"

namespace orrery::kernels {
namespace {

using gpu_bench::RandomOnGpu;

double TimeMs(const std::function<Status()>& fn) { return gpu_bench::TimeMs(fn, 2, 10); }

int Run() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is measured
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "attention_gpu_bench: no CUDA device\n");
    return 1;
  }
  constexpr int64_t kDocs = 4, kLen = 8192, kHeads = 16, kV = 128;
  constexpr int64_t kTokens = kDocs * kLen;
  std::vector<int64_t> offsets;
  for (int64_t d = 0; d <= kDocs; ++d) offsets.push_back(d * kLen);
  const Tensor cu = Tensor::FromVector<int64_t>({kDocs + 1}, offsets).To(Device::Cuda(0)).value();
  const DType dt = DType::kBF16;
  // Per document and head: T^2 / 2 visible (query, key) pairs, 2 FLOPs per multiply-add.
  const double pairs = kDocs * kHeads * 0.5 * static_cast<double>(kLen) * kLen;
  for (const int64_t qk : {int64_t{192}, int64_t{128}}) {
    const Tensor q = RandomOnGpu({kTokens, kHeads, qk}, dt, 1);
    const Tensor k = RandomOnGpu({kTokens, kHeads, qk}, dt, 2);
    const Tensor v = RandomOnGpu({kTokens, kHeads, kV}, dt, 3);
    const Tensor d_o = RandomOnGpu({kTokens, kHeads, kV}, dt, 4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
    const double fwd_flops = 2.0 * pairs * static_cast<double>(qk + kV);
    const double bwd_flops = 2.0 * pairs * static_cast<double>(3 * qk + 2 * kV);
    Tensor o, lse, dq, dk, dv;
    for (const cuda::AttentionKernels kernels :
         {cuda::AttentionKernels::kFastest, cuda::AttentionKernels::kSimt}) {
      const bool tc = kernels == cuda::AttentionKernels::kFastest;
      if (tc && !cuda::AttentionTcSupported(q, v)) {
        std::fprintf(stderr, "attention_gpu_bench: qk %lld is not a tensor-core case\n",
                     static_cast<long long>(qk));
        return 1;
      }
      // The first (tensor-core) run allocates the outputs through the op; the SIMT run reuses them.
      const double fwd = TimeMs([&] {
        return tc ? CausalAttention(q, k, v, cu, scale, &o, &lse)
                  : cuda::CausalAttentionForwardCuda(q, k, v, cu, scale, &o, &lse, kernels);
      });
      const double bwd = TimeMs([&] {
        return tc ? CausalAttentionGrad(q, k, v, o, lse, d_o, cu, scale, &dq, &dk, &dv)
                  : cuda::CausalAttentionBackwardCuda(q, k, v, o, lse, d_o, cu, scale, &dq, &dk,
                                                      &dv, kernels);
      });
      const char* name = tc ? "tc  " : "simt";
      if (fwd < 0 || bwd < 0) {
        std::fprintf(stderr, "attention_gpu_bench: a %s qk %lld run failed\n", name,
                     static_cast<long long>(qk));
        return 1;
      }
      std::printf(
          "attention fwd %s bf16 (B,T,H)=(4,8192,16) qk%lld v128 causal %10.3f ms %8.2f TFLOP/s\n",
          name, static_cast<long long>(qk), fwd, fwd_flops / (fwd * 1e-3) / 1e12);
      std::printf(
          "attention bwd %s bf16 (B,T,H)=(4,8192,16) qk%lld v128 causal %10.3f ms %8.2f TFLOP/s\n",
          name, static_cast<long long>(qk), bwd, bwd_flops / (bwd * 1e-3) / 1e12);
    }
  }
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main() { return orrery::kernels::Run(); }
