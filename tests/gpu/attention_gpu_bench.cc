// Times the causal attention kernels (kernels/attention.h) on the GPU with CUDA events: the median
// of 10 runs after 2 warm-ups, on random bf16 inputs (tests/gpu/gpu_bench_util.h), for the kernel
// sets of ops_cuda.h that take the model's heads: the forward of kWgmma
// (attention_forward_wgmma.cu, with its consumers' ping-pong and without: AttentionForwardWgmma's
// ping_pong) and of kMma (attention_forward_tc.cu), and the backward of each (kMma:
// attention_backward_tc.cu; kWgmma: attention_backward_dkdv_wgmma.cu and
// attention_backward_dq_wgmma.cu). Issue 23's shapes, (B, T, H) = (4, 8192, 16), (1, 65536, 16) and
// (1, 8192, 128), each a packed batch of B documents of T tokens, with the model's full-size head
// (qk 192, v 128) and the square 128/128 head; scripts/gpu_attention_torch.py times cuDNN on the
// same shapes. Prints one line per kernel set, pass and shape with its causal TFLOP/s: the
// forward's 2 products cost 2 T^2/2 (dqk + dv) FLOPs per document and head, the backward's 5 (dq,
// dk, dv and the recomputed S and dP) 2 T^2/2 (3 dqk + 2 dv); work a kernel adds (a separate dq
// pass recomputing S and dP) is not counted. Each shape also prints how far the wgmma set's o,
// lse and dq are from the mma set's (relative RMS; both round to bf16, so ~2e-3 is agreement and
// a broken tile shows as >= 1e-1).
//
//   attention_gpu_bench [SHAPE...]   SHAPE: 4x8192x16, 1x65536x16 or 1x8192x128 (default: all)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/ops_cuda.h"
#include "tests/gpu/gpu_bench_util.h"

namespace orrery::kernels {
namespace {

using gpu_bench::RandomOnGpu;

double TimeMs(const std::function<Status()>& fn) { return gpu_bench::TimeMs(fn, 2, 10); }

struct BenchShape {
  int64_t docs, len, heads;
  std::string Name() const {
    return std::to_string(docs) + "x" + std::to_string(len) + "x" + std::to_string(heads);
  }
};

// ||a - b|| / ||b|| over all elements (bf16 or f32 device tensors of one shape).
double RelRms(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.To(Device::Cpu()).value().Cast(DType::kF32).value();
  const Tensor hb = b.To(Device::Cpu()).value().Cast(DType::kF32).value();
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ha.numel(); ++i) {
    const double x = ha.data<float>()[i], y = hb.data<float>()[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Times one shape for both head dims; false when a run fails.
bool RunShape(const BenchShape& s) {
  const int64_t tokens = s.docs * s.len;
  constexpr int64_t kV = 128;
  std::vector<int64_t> offsets;
  for (int64_t d = 0; d <= s.docs; ++d) offsets.push_back(d * s.len);
  const Tensor cu = Tensor::FromVector<int64_t>({s.docs + 1}, offsets).To(Device::Cuda(0)).value();
  const DType dt = DType::kBF16;
  const cudaStream_t stream = cuda::DeviceContext::Get(0).value()->stream();
  // Per document and head: T^2 / 2 visible (query, key) pairs, 2 FLOPs per multiply-add.
  const double pairs = static_cast<double>(s.docs * s.heads) * 0.5 * static_cast<double>(s.len) *
                       static_cast<double>(s.len);
  for (const int64_t qk : {int64_t{192}, int64_t{128}}) {
    const Tensor q = RandomOnGpu({tokens, s.heads, qk}, dt, 1);
    const Tensor k = RandomOnGpu({tokens, s.heads, qk}, dt, 2);
    const Tensor v = RandomOnGpu({tokens, s.heads, kV}, dt, 3);
    const Tensor d_o = RandomOnGpu({tokens, s.heads, kV}, dt, 4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
    const double fwd_flops = 2.0 * pairs * static_cast<double>(qk + kV);
    const double bwd_flops = 2.0 * pairs * static_cast<double>(3 * qk + 2 * kV);
    if (!cuda::AttentionWgmmaSupported(q, k, v, scale)) {
      std::fprintf(stderr, "attention_gpu_bench: the wgmma forward does not take qk %lld here\n",
                   static_cast<long long>(qk));
      return false;
    }
    const auto alloc = [&](const Shape& shape, DType t) {
      return Tensor::Allocate(shape, t, Device::Cuda(0)).value();
    };
    Tensor o_w = alloc({tokens, s.heads, kV}, dt), lse_w = alloc({tokens, s.heads}, DType::kF32);
    Tensor o_m = alloc({tokens, s.heads, kV}, dt), lse_m = alloc({tokens, s.heads}, DType::kF32);
    Tensor o_f = alloc({tokens, s.heads, kV}, dt), lse_f = alloc({tokens, s.heads}, DType::kF32);
    Tensor dq_w = alloc({tokens, s.heads, qk}, dt);
    Tensor dq = alloc({tokens, s.heads, qk}, dt), dk = alloc({tokens, s.heads, qk}, dt),
           dv = alloc({tokens, s.heads, kV}, dt);
    const std::string label = s.Name();
    const auto print = [&](const char* pass, const char* set, double ms, double flops) {
      std::printf(
          "attention %s %-17s bf16 (B,T,H)=(%lld,%lld,%lld) qk%lld v128 causal %10.3f ms %8.2f "
          "TFLOP/s\n",
          pass, set, static_cast<long long>(s.docs), static_cast<long long>(s.len),
          static_cast<long long>(s.heads), static_cast<long long>(qk), ms,
          flops / (ms * 1e-3) / 1e12);
    };
    const double fwd_w = TimeMs([&] {
      return cuda::CausalAttentionForwardCuda(q, k, v, cu, scale, &o_w, &lse_w,
                                              cuda::AttentionKernels::kWgmma);
    });
    const double fwd_free = TimeMs([&] {
      return cuda::AttentionForwardWgmma(q, k, v, cu, scale, &o_f, &lse_f, stream,
                                         /*ping_pong=*/false);
    });
    const double fwd_m = TimeMs([&] {
      return cuda::CausalAttentionForwardCuda(q, k, v, cu, scale, &o_m, &lse_m,
                                              cuda::AttentionKernels::kMma);
    });
    const double bwd_w = TimeMs([&] {
      return cuda::CausalAttentionBackwardCuda(q, k, v, o_m, lse_m, d_o, cu, scale, &dq_w, &dk, &dv,
                                               cuda::AttentionKernels::kWgmma);
    });
    const double bwd = TimeMs([&] {
      return cuda::CausalAttentionBackwardCuda(q, k, v, o_m, lse_m, d_o, cu, scale, &dq, &dk, &dv,
                                               cuda::AttentionKernels::kMma);
    });
    if (fwd_w < 0 || fwd_free < 0 || fwd_m < 0 || bwd_w < 0 || bwd < 0) {
      std::fprintf(stderr, "attention_gpu_bench: a run at %s qk %lld failed\n", label.c_str(),
                   static_cast<long long>(qk));
      return false;
    }
    print("fwd", "wgmma", fwd_w, fwd_flops);
    print("fwd", "wgmma-no-pingpong", fwd_free, fwd_flops);
    print("fwd", "mma", fwd_m, fwd_flops);
    print("bwd", "wgmma", bwd_w, bwd_flops);
    print("bwd", "mma", bwd, bwd_flops);
    std::printf(
        "attention fwd wgmma vs mma (B,T,H)=(%lld,%lld,%lld) qk%lld: o rel RMS %.3g, lse rel "
        "RMS %.3g, wgmma %.2fx mma; without ping-pong o rel RMS %.3g to with; bwd dq rel RMS "
        "%.3g, wgmma %.2fx mma\n",
        static_cast<long long>(s.docs), static_cast<long long>(s.len),
        static_cast<long long>(s.heads), static_cast<long long>(qk), RelRms(o_w, o_m),
        RelRms(lse_w, lse_m), fwd_m / fwd_w, RelRms(o_f, o_w), RelRms(dq_w, dq), bwd / bwd_w);
  }
  return true;
}

int Run(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is measured
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "attention_gpu_bench: no CUDA device\n");
    return 1;
  }
  const std::vector<BenchShape> all = {{4, 8192, 16}, {1, 65536, 16}, {1, 8192, 128}};
  std::vector<BenchShape> shapes;
  for (int i = 1; i < argc; ++i) {
    const auto it = std::find_if(all.begin(), all.end(),
                                 [&](const BenchShape& s) { return s.Name() == argv[i]; });
    if (it == all.end()) {
      std::fprintf(stderr,
                   "attention_gpu_bench: shape %s, expected 4x8192x16, 1x65536x16 or 1x8192x128\n",
                   argv[i]);
      return 2;
    }
    shapes.push_back(*it);
  }
  if (shapes.empty()) shapes = all;
  for (const BenchShape& s : shapes) {
    if (!RunShape(s)) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main(int argc, char** argv) { return orrery::kernels::Run(argc, argv); }
