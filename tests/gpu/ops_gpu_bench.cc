// Times the GPU model's Tensor-level ops (issue 22) on random inputs with CUDA events: the median
// of 30 runs after 5 warm-ups, each run on the same inputs (sizes well past the 50 MB L2 where it
// matters: the norm's rows are 128 MB and more). Prints one line per op and shape; the anchors
// (torch.matmul, torch rms_norm, a device-to-device copy) come from scripts/gpu_ops_torch.py in
// the same call (scripts/gpu_ops.sh). The backward passes whose cross-block sums run in a fixed
// order (kernels/cuda/column_sums.h) are timed at bench-1b's shapes (4 x 4K tokens, width 1536),
// with their rate counting each input read once and each output written once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/philox.h"
#include "kernels/adamw_op.h"
#include "kernels/attn_res.h"
#include "kernels/embedding.h"
#include "kernels/gates.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/short_conv.h"
#include "kernels/situ.h"
#include "tests/gpu/gpu_bench_util.h"

namespace orrery::kernels {
namespace {

using gpu_bench::RandomOnGpu;

double TimeMs(const std::function<Status()>& fn) { return gpu_bench::TimeMs(fn, 5, 30); }

int Run() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is measured
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "ops_gpu_bench: no CUDA device\n");
    return 1;
  }
  std::printf("%-44s %10s %12s\n", "op (shape)", "ms", "rate");
  // The linear layers of a 2048-wide model over 8192 tokens, and the LM head's 32K vocabulary.
  struct Mm {
    const char* name;
    int64_t m, n, k;
    bool ta, tb;
    DType out;
    float beta;
  };
  for (const Mm& c :
       {Mm{"y = x W^T  8192x2048 . 2048x2048", 8192, 2048, 2048, false, true, DType::kBF16, 0.0f},
        Mm{"dx = dy W  8192x2048 . 2048x2048", 8192, 2048, 2048, false, false, DType::kBF16, 0.0f},
        Mm{"dW += dy^T x (f32)  2048x8192 . 8192x2048", 2048, 2048, 8192, true, false, DType::kF32,
           1.0f},
        Mm{"logits  8192x2048 . 2048x32768", 8192, 32768, 2048, false, true, DType::kBF16, 0.0f},
        Mm{"y = x W^T  16384x7168 . 7168x7168", 16384, 7168, 7168, false, true, DType::kBF16,
           0.0f}}) {
    const Tensor a = RandomOnGpu(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, DType::kBF16, 1);
    const Tensor b = RandomOnGpu(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, DType::kBF16, 2);
    Tensor out = RandomOnGpu({c.m, c.n}, c.out, 3);
    const MatmulOptions o{c.ta, c.tb, 1.0f, c.beta};
    const double ms = TimeMs([&] { return Matmul(a, b, o, &out); });
    std::printf("matmul %-37s %10.3f %8.1f TFLOP/s\n", c.name, ms,
                2.0 * c.m * c.n * c.k / (ms * 1e-3) / 1e12);
  }
  for (auto [rows, d] :
       {std::pair<int64_t, int64_t>{32768, 2048}, {16384, 7168}, {16384 * 16, 128}}) {
    const Tensor x = RandomOnGpu({rows, d}, DType::kBF16, 4), w = RandomOnGpu({d}, DType::kBF16, 5);
    const Tensor dy = RandomOnGpu({rows, d}, DType::kBF16, 6);
    Tensor y, rstd, dx, dw = RandomOnGpu({d}, DType::kF32, 7);
    const double fwd = TimeMs([&] { return RmsNorm(x, w, 1e-6, &y, &rstd); });
    const double bwd = TimeMs([&] { return RmsNormGrad(x, w, rstd, dy, &dx, &dw); });
    const double bytes = 2.0 * rows * d * 2;  // read x, write y (bf16)
    std::printf("rmsnorm fwd bf16 %6lldx%-5lld                    %10.3f %8.1f GB/s\n",
                static_cast<long long>(rows), static_cast<long long>(d), fwd,
                bytes / (fwd * 1e-3) / 1e9);
    std::printf("rmsnorm bwd bf16 %6lldx%-5lld                    %10.3f %8.1f GB/s\n",
                static_cast<long long>(rows), static_cast<long long>(d), bwd,
                1.5 * bytes / (bwd * 1e-3) / 1e9);  // read x, dy; write dx
  }
  {
    const int64_t rows = 16384, d = 1536, n = 5;
    std::vector<Tensor> src;
    for (int64_t i = 0; i < n; ++i) src.push_back(RandomOnGpu({rows, d}, DType::kBF16, 20 + i));
    const Tensor w = RandomOnGpu({d}, DType::kBF16, 30), g = RandomOnGpu({d}, DType::kBF16, 31);
    const Tensor dh = RandomOnGpu({rows, d}, DType::kBF16, 32);
    Tensor h, p;
    if (!AttnResMix(src, w, g, 1e-6, &h, &p).ok()) return 1;
    std::vector<Tensor> ds(n);
    for (int64_t i = 0; i < n; ++i) ds[i] = RandomOnGpu({rows, d}, DType::kF32, 40 + i);
    Tensor dw = RandomOnGpu({d}, DType::kF32, 33), dg = RandomOnGpu({d}, DType::kF32, 34);
    const double ms = TimeMs([&] { return AttnResMixGrad(src, w, g, 1e-6, p, dh, &ds, &dw, &dg); });
    // Sources and dh in bf16, the f32 source gradients read and written.
    const double bytes = rows * d * (2.0 * (n + 1) + 8.0 * n);
    std::printf("attn_res bwd bf16 %lldx%lld, %lld sources      %10.3f %8.1f GB/s\n",
                static_cast<long long>(rows), static_cast<long long>(d), static_cast<long long>(n),
                ms, bytes / (ms * 1e-3) / 1e9);
  }
  {
    const int64_t n = 16384, c = 2048, width = 4;
    const Tensor x = RandomOnGpu({n, c}, DType::kBF16, 50),
                 dy = RandomOnGpu({n, c}, DType::kBF16, 51);
    const Tensor w = RandomOnGpu({c, width}, DType::kBF16, 52);
    const Tensor cu_host = Tensor::FromVector<int64_t>({3}, {0, 8192, n});
    const Tensor cu = cu_host.To(Device::Cuda(0)).value();
    Tensor dx, dw = RandomOnGpu({c, width}, DType::kF32, 53);
    const double ms = TimeMs([&] { return ShortConvSiluGrad(x, w, cu, cu_host, dy, &dx, &dw); });
    std::printf("short conv bwd bf16 %lldx%lld, width 4          %10.3f %8.1f GB/s\n",
                static_cast<long long>(n), static_cast<long long>(c), ms,
                3.0 * n * c * 2 / (ms * 1e-3) / 1e9);  // read x, dy; write dx
  }
  {
    const int64_t rows = 16384, cols = 1536;
    const Tensor dy = RandomOnGpu({rows, cols}, DType::kBF16, 54);
    Tensor db = RandomOnGpu({cols}, DType::kF32, 55);
    const double ms = TimeMs([&] { return RowBiasGrad(dy, &db); });
    std::printf("row bias grad bf16 %lldx%lld                   %10.3f %8.1f GB/s\n",
                static_cast<long long>(rows), static_cast<long long>(cols), ms,
                2.0 * rows * cols / (ms * 1e-3) / 1e9);
  }
  for (bool skewed : {false, true}) {
    // Uniform ids over a 32K vocabulary, or a third of them one token (its rows summed in order
    // by one block per column range: the longest run of one id sets the time).
    const int64_t n = 16384, vocab = 32768, d = 1536;
    PhiloxGenerator rng(60, 0);
    std::vector<int32_t> id(n);
    for (int32_t& v : id) {
      v = skewed && rng.UniformInt(3) == 0 ? 7 : static_cast<int32_t>(rng.UniformInt(vocab));
    }
    const Tensor ids = Tensor::FromVector<int32_t>({n}, id).To(Device::Cuda(0)).value();
    const Tensor dy = RandomOnGpu({n, d}, DType::kBF16, 61);
    Tensor dtable = RandomOnGpu({vocab, d}, DType::kF32, 62);
    const double ms = TimeMs([&] { return EmbeddingScatterAdd(ids, dy, &dtable); });
    std::printf("embedding bwd bf16 %lld tokens x %lld, %s  %10.3f %8.1f GB/s\n",
                static_cast<long long>(n), static_cast<long long>(d),
                skewed ? "1/3 one id" : "uniform   ", ms,
                n * d * (2.0 + 8.0) / (ms * 1e-3) / 1e9);  // read dy; read + write table rows
  }
  {
    const int64_t n = int64_t{8192} * 8192;
    const Tensor a = RandomOnGpu({n}, DType::kBF16, 8), u = RandomOnGpu({n}, DType::kBF16, 9);
    Tensor h;
    GluActivation act;
    const double ms = TimeMs([&] { return Glu(act, a, u, &h); });
    std::printf("situ-glu fwd bf16 %-26lld %10.3f %8.1f GB/s\n", static_cast<long long>(n), ms,
                3.0 * n * 2 / (ms * 1e-3) / 1e9);
  }
  {
    const int64_t n = int64_t{128} << 20;  // 128M parameters
    const Tensor g = RandomOnGpu({n}, DType::kF32, 10);
    Tensor p = RandomOnGpu({n}, DType::kF32, 11), m = RandomOnGpu({n}, DType::kF32, 12);
    Tensor v = RandomOnGpu({n}, DType::kF32, 13, true), pb = RandomOnGpu({n}, DType::kBF16, 14);
    AdamWStepArgs args;
    args.lr = 1e-4;
    Tensor sumsq, factor;
    const double ms = TimeMs([&] {
      ORRERY_RETURN_IF_ERROR(SquaredNorm({g}, &sumsq));
      ORRERY_RETURN_IF_ERROR(ClipFactor(sumsq, 1.0, &factor));
      return AdamWStep(args, g, factor, &p, &m, &v, &pb);
    });
    // norm reads g; the step reads g, p, m, v and writes p, m, v, bf16 p.
    const double bytes = 4.0 * n + n * (4.0 * 4 + 3 * 4 + 2);
    std::printf("clip+adamw f32 (128M params)                  %10.3f %8.1f GB/s\n", ms,
                bytes / (ms * 1e-3) / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main() { return orrery::kernels::Run(); }
