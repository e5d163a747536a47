// Times the causal attention op (kernels/attention.h) on the GPU with CUDA events: the median of
// 10 runs after 2 warm-ups, on fresh random bf16 inputs. The case is the model's full-size head
// (qk 192, v 128) over one packed batch of 4 documents of 8192 tokens, 16 heads. Prints one line
// per pass with its causal TFLOP/s: the forward's 2 products cost 2 T^2/2 (dqk + dv) FLOPs per
// document and head, the backward's 5 (dq, dk, dv and the recomputed S and dP) 2 T^2/2
// (3 dqk + 2 dv); work a kernel adds (a separate dq pass recomputing S and dP) is not counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/philox.h"
#include "kernels/attention.h"

namespace orrery::kernels {
namespace {

// N(0, 1) entries drawn on the host in f32, rounded to dt and copied to the GPU.
Tensor RandomOnGpu(const Shape& shape, DType dt, uint64_t seed) {
  PhiloxGenerator rng(seed, 0);
  Tensor h = Tensor::Empty(shape, DType::kF32);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = static_cast<float>(rng.Normal());
  return (dt == DType::kF32 ? h : h.Cast(dt).value()).To(Device::Cuda(0)).value();
}

// Median milliseconds of `fn` over 10 timed runs (-1 when it fails).
double TimeMs(const std::function<Status()>& fn) {
  for (int i = 0; i < 2; ++i) {
    if (!fn().ok()) return -1;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(a);
    if (!fn().ok()) return -1;
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Run() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is measured
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "attention_gpu_bench: no CUDA device\n");
    return 1;
  }
  constexpr int64_t kDocs = 4, kLen = 8192, kHeads = 16, kQk = 192, kV = 128;
  constexpr int64_t kTokens = kDocs * kLen;
  std::vector<int64_t> offsets;
  for (int64_t d = 0; d <= kDocs; ++d) offsets.push_back(d * kLen);
  const Tensor cu = Tensor::FromVector<int64_t>({kDocs + 1}, offsets).To(Device::Cuda(0)).value();
  const DType dt = DType::kBF16;
  const Tensor q = RandomOnGpu({kTokens, kHeads, kQk}, dt, 1);
  const Tensor k = RandomOnGpu({kTokens, kHeads, kQk}, dt, 2);
  const Tensor v = RandomOnGpu({kTokens, kHeads, kV}, dt, 3);
  const Tensor d_o = RandomOnGpu({kTokens, kHeads, kV}, dt, 4);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kQk));
  Tensor o, lse, dq, dk, dv;
  const double fwd = TimeMs([&] { return CausalAttention(q, k, v, cu, scale, &o, &lse); });
  const double bwd =
      TimeMs([&] { return CausalAttentionGrad(q, k, v, o, lse, d_o, cu, scale, &dq, &dk, &dv); });
  // Per document and head: T^2 / 2 visible (query, key) pairs, 2 FLOPs per multiply-add.
  const double pairs = kDocs * kHeads * 0.5 * static_cast<double>(kLen) * kLen;
  std::printf("attention fwd bf16 (B,T,H)=(4,8192,16) qk192 v128 causal %10.3f ms %8.2f TFLOP/s\n",
              fwd, 2.0 * pairs * (kQk + kV) / (fwd * 1e-3) / 1e12);
  std::printf("attention bwd bf16 (B,T,H)=(4,8192,16) qk192 v128 causal %10.3f ms %8.2f TFLOP/s\n",
              bwd, 2.0 * pairs * (3 * kQk + 2 * kV) / (bwd * 1e-3) / 1e12);
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main() { return orrery::kernels::Run(); }
