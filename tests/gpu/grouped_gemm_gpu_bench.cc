// Times the grouped GEMMs (kernels/grouped_gemm.h) on both kernels (mma.sync and wgmma + TMA,
// forced by ORRERY_GROUPED_GEMM) against the per-expert cuBLASLt loop that MoeExperts ran before
// them (kernels::Matmul on each expert's row views), in the same process on the same random
// device inputs: the median of 20 runs after 3 warm-ups by CUDA events. The loop's time includes
// its host launches, as in the model (and nothing else: its offsets are on the host from the
// start, while the model paid a read back and a stream synchronisation for them).
// Counts: about M / E rows per expert, +-25% by a fixed formula that
// scripts/gpu_grouped_gemm_torch.py repeats (its torch._grouped_mm anchor times the same counts):
// weight_i = 0.75 + 0.5 frac(0.6180339887 i), offsets[i + 1] = floor(M (w_0 + .. + w_i) / sum w).
// Shapes (W [E, N, K]):
//   small:    M = 131072 rows (8 x 4K tokens, top-4), E = 32, N = K = 512.
//   bench-1b: M = 131072 rows (16K tokens, top-8), E = 64, latent L = 768, expert width F = 512:
//             the gate/up products [F, L] and the down product [L, F].
//   anchors of issue 24 (forward only, as the torch figures): 128, 512, 2048 and 8192 rows
//             per expert for 32 experts of 1024 x 1024, 128 of 768 x 768 and 64 of 3584 x 3072
//             (K3's expert).
// One line per (shape, product): the ms and TFLOP/s of mma, of wgmma (its own choice of tile
// width) and of wgmma with each width forced, of the loop, and the speed-ups of wgmma over mma and
// over the loop. dX is f32 and dW f32 accumulated (torch's anchor writes bf16).
// The fused gate/up GLU (GroupedGemmGlu) against its unfused composition, where it runs.
// ORRERY_BENCH_QUICK=1 times only the anchors (a shorter device call).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/grouped_gemm_cuda.h"
#include "kernels/grouped_gemm.h"
#include "kernels/matmul.h"
#include "kernels/situ.h"
#include "tests/gpu/gpu_bench_util.h"

namespace orrery::kernels {
namespace {

using gpu_bench::RandomOnGpu;

double TimeMs(const std::function<Status()>& fn) { return gpu_bench::TimeMs(fn, 3, 20); }

// The counts of the header's formula, as offsets [E + 1] summing to m.
std::vector<int64_t> Offsets(int64_t m, int64_t e) {
  std::vector<double> w(static_cast<size_t>(e));
  double total = 0;
  for (int64_t i = 0; i < e; ++i) {
    const double f = 0.6180339887 * static_cast<double>(i);
    w[i] = 0.75 + 0.5 * (f - std::floor(f));
    total += w[i];
  }
  std::vector<int64_t> off(static_cast<size_t>(e + 1), 0);
  double acc = 0;
  for (int64_t i = 0; i < e; ++i) {
    acc += w[i];
    off[i + 1] =
        i + 1 == e ? m : static_cast<int64_t>(std::floor(static_cast<double>(m) * acc / total));
  }
  return off;
}

StatusOr<Tensor> ExpertOf(const Tensor& w, int64_t e) {
  ORRERY_ASSIGN_OR_RETURN(Tensor one, w.Slice(e, e + 1));
  return one.Reshape({w.dim(1), w.dim(2)});
}

// Sets ORRERY_GROUPED_GEMM for one timing.
struct Forced {
  explicit Forced(const char* kernel) { setenv("ORRERY_GROUPED_GEMM", kernel, 1); }
  ~Forced() { unsetenv("ORRERY_GROUPED_GEMM"); }
};

// One shape: M rows of E experts, W [E, N, K].
void Bench(const std::string& name, int64_t m, int64_t e, int64_t n, int64_t k, bool forward_only,
           bool wgmma) {
  const std::vector<int64_t> off = Offsets(m, e);
  const Tensor off_dev = Tensor::FromVector<int64_t>({e + 1}, off).To(Device::Cuda(0)).value();
  const Tensor x = RandomOnGpu({m, k}, DType::kBF16, 1), dy = RandomOnGpu({m, n}, DType::kBF16, 2);
  const Tensor w = RandomOnGpu({e, n, k}, DType::kBF16, 3);
  Tensor y = RandomOnGpu({m, n}, DType::kBF16, 4);
  Tensor dx = forward_only ? Tensor() : RandomOnGpu({m, k}, DType::kF32, 5);
  Tensor dw = forward_only ? Tensor() : RandomOnGpu({e, n, k}, DType::kF32, 6);
  // The loop: Matmul on each expert's rows.
  auto loop = [&](int product) -> Status {
    for (int64_t i = 0; i < e; ++i) {
      if (off[i + 1] == off[i]) continue;
      ORRERY_ASSIGN_OR_RETURN(const Tensor we, ExpertOf(w, i));
      if (product == 0) {
        ORRERY_ASSIGN_OR_RETURN(const Tensor xe, x.Slice(off[i], off[i + 1]));
        ORRERY_ASSIGN_OR_RETURN(Tensor ye, y.Slice(off[i], off[i + 1]));
        ORRERY_RETURN_IF_ERROR(Matmul(xe, we, {false, true, 1.0f, 0.0f}, &ye));
      } else if (product == 1) {
        ORRERY_ASSIGN_OR_RETURN(const Tensor ge, dy.Slice(off[i], off[i + 1]));
        ORRERY_ASSIGN_OR_RETURN(Tensor dxe, dx.Slice(off[i], off[i + 1]));
        ORRERY_RETURN_IF_ERROR(Matmul(ge, we, {false, false, 1.0f, 0.0f}, &dxe));
      } else {
        ORRERY_ASSIGN_OR_RETURN(const Tensor ge, dy.Slice(off[i], off[i + 1]));
        ORRERY_ASSIGN_OR_RETURN(const Tensor xe, x.Slice(off[i], off[i + 1]));
        ORRERY_ASSIGN_OR_RETURN(Tensor dwe, ExpertOf(dw, i));
        ORRERY_RETURN_IF_ERROR(Matmul(ge, xe, {true, false, 1.0f, 1.0f}, &dwe));
      }
    }
    return Status::OK();
  };
  auto grouped = [&](int product) -> Status {
    if (product == 0) return GroupedGemmForward(x, w, off_dev, &y);
    if (product == 1) return GroupedGemmInputGrad(dy, w, off_dev, false, &dx);
    return GroupedGemmWeightGrad(dy, x, off_dev, &dw);
  };
  const char* products[] = {"Y = X W_e^T (bf16)", "dX = dY W_e (f32)", "dW_e += dY^T X (f32)"};
  const double flops = 2.0 * m * n * k;
  auto tf = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  for (int product = 0; product < (forward_only ? 1 : 3); ++product) {
    // mma, wgmma (its own tile width), wgmma with 256- and with 128-column tiles.
    const char* kernels[] = {"mma", "wgmma", "wgmma256", "wgmma128"};
    double ms[4] = {0, 0, 0, 0};
    for (int i = 0; i < (wgmma ? 4 : 1); ++i) {
      const Forced f(kernels[i]);
      ms[i] = TimeMs([&] { return grouped(product); });
    }
    const double l = TimeMs([&] { return loop(product); });
    std::printf(
        "%-26s %-21s M %7lld E %4lld N %5lld K %5lld  mma %7.3f ms %5.1f TF  wgmma %7.3f ms %5.1f "
        "TF "
        "(256: %7.3f ms %5.1f TF, 128: %7.3f ms %5.1f TF)  loop %7.3f ms %5.1f TF  wgmma/mma x%.2f "
        "wgmma/loop x%.2f\n",
        name.c_str(), products[product], static_cast<long long>(m), static_cast<long long>(e),
        static_cast<long long>(n), static_cast<long long>(k), ms[0], tf(ms[0]), ms[1], tf(ms[1]),
        ms[2], tf(ms[2]), ms[3], tf(ms[3]), l, tf(l), ms[1] > 0 ? ms[0] / ms[1] : 0.0,
        ms[1] > 0 ? l / ms[1] : 0.0);
  }
}

// The fused gate/up product (GroupedGemmGlu, SiTU-GLU in the epilogue, h bf16) against its unfused
// composition (GroupedGemmForward for a and for u into bf16, then Glu), both on the default
// kernel: M rows of E experts, W1 and W3 [E, F, L].
void BenchGlu(const std::string& name, int64_t m, int64_t e, int64_t f, int64_t l) {
  const std::vector<int64_t> off = Offsets(m, e);
  const Tensor off_dev = Tensor::FromVector<int64_t>({e + 1}, off).To(Device::Cuda(0)).value();
  const Tensor x = RandomOnGpu({m, l}, DType::kBF16, 11);
  const Tensor w1 = RandomOnGpu({e, f, l}, DType::kBF16, 12);
  const Tensor w3 = RandomOnGpu({e, f, l}, DType::kBF16, 13);
  Tensor h = RandomOnGpu({m, f}, DType::kBF16, 14), a = RandomOnGpu({m, f}, DType::kBF16, 15);
  Tensor u = RandomOnGpu({m, f}, DType::kBF16, 16);
  const GluActivation act;
  const double fused = TimeMs([&] { return GroupedGemmGlu(act, x, w1, w3, off_dev, &h); });
  const double fused_au =
      TimeMs([&] { return GroupedGemmGlu(act, x, w1, w3, off_dev, &h, &a, &u); });
  const double unfused = TimeMs([&]() -> Status {
    ORRERY_RETURN_IF_ERROR(GroupedGemmForward(x, w1, off_dev, &a));
    ORRERY_RETURN_IF_ERROR(GroupedGemmForward(x, w3, off_dev, &u));
    return Glu(act, a, u, &h);
  });
  const double flops = 2.0 * 2.0 * m * f * l;
  auto tf = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  std::printf(
      "%-26s %-21s M %7lld E %4lld F %5lld L %5lld  fused %8.3f ms %6.1f TF  fused+a,u %8.3f ms "
      "%6.1f TF  unfused %8.3f ms %6.1f TF  fused/unfused x%.2f\n",
      name.c_str(), "h = situ(X W1^T, X W3^T)", static_cast<long long>(m),
      static_cast<long long>(e), static_cast<long long>(f), static_cast<long long>(l), fused,
      tf(fused), fused_au, tf(fused_au), unfused, tf(unfused), fused > 0 ? unfused / fused : 0.0);
}

int Run() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is measured
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "grouped_gemm_gpu_bench: no CUDA device\n");
    return 1;
  }
  const bool wgmma = cuda::GroupedGemmWgmmaAvailable(0);
  if (!wgmma) std::printf("the wgmma kernel needs a compute capability 9.0 device: not timed\n");
  const char* quick_env = std::getenv("ORRERY_BENCH_QUICK");
  const bool quick = quick_env != nullptr && std::string(quick_env) == "1";
  if (!quick) {
    Bench("small", 131072, 32, 512, 512, false, wgmma);
    Bench("bench-1b gate/up [F, L]", 131072, 64, 512, 768, false, wgmma);
    Bench("bench-1b down [L, F]", 131072, 64, 768, 512, false, wgmma);
  }
  if (!quick && GroupedGemmGluFused(Device::Cuda(0))) {
    BenchGlu("bench-1b gate/up", 131072, 64, 512, 768);
    BenchGlu("fine-grained 128 x 384", 131072, 128, 384, 768);
  }
  struct Anchor {
    int64_t e, n, k;
  };
  for (const Anchor& a : {Anchor{32, 1024, 1024}, Anchor{128, 768, 768}, Anchor{64, 3584, 3072}}) {
    for (int64_t rows : {128, 512, 2048, 8192}) {
      Bench("anchor " + std::to_string(rows) + " rows/expert", a.e * rows, a.e, a.n, a.k, true,
            wgmma);
    }
  }
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main() { return orrery::kernels::Run(); }
