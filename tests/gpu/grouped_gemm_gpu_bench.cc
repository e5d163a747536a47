// Times the grouped GEMMs (kernels/grouped_gemm.h) against the per-expert cuBLASLt loop that
// MoeExperts ran before them (kernels::Matmul on each expert's row views), in the same process on
// the same random device inputs: the median of 20 runs after 3 warm-ups by CUDA events. The loop's
// time includes its host launches, as in the model (and nothing else: its offsets are on the host
// from the start, while the model paid a read back and a stream synchronisation for them).
// Shapes (rows = tokens x top-k, about M / E rows per expert, +-25% at random):
//   small:    M = 131072 rows (8 x 4K tokens, top-4), E = 32, N = K = 512.
//   bench-1b: M = 131072 rows (16K tokens, top-8), E = 64, latent L = 768, expert width F = 512:
//             the gate/up products [F, L] and the down product [L, F].
//   anchors of issue 24: 32 experts of 1024 x 1024 at 128, 512, 2048 and 8192 rows per expert
//             (torch._grouped_mm on an H200: 149 / 381 / 554 / 642 TFLOP/s), forward only.
// One line per (shape, product): grouped ms, loop ms, TFLOP/s of each, the speed-up.
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/grouped_gemm.h"
#include "kernels/matmul.h"
#include "tests/gpu/gpu_bench_util.h"

namespace orrery::kernels {
namespace {

using gpu_bench::RandomOnGpu;

double TimeMs(const std::function<Status()>& fn) { return gpu_bench::TimeMs(fn, 3, 20); }

// Counts of about m / e rows each (+-25%), summing to m.
std::vector<int64_t> Offsets(int64_t m, int64_t e, uint64_t seed) {
  PhiloxGenerator rng(seed, 0);
  std::vector<double> w(static_cast<size_t>(e));
  double total = 0;
  for (double& v : w) total += v = 0.75 + 0.5 * (rng.NextU32() / 4294967296.0);
  std::vector<int64_t> off(static_cast<size_t>(e + 1), 0);
  double acc = 0;
  for (int64_t i = 0; i < e; ++i) {
    acc += w[i];
    off[i + 1] = i + 1 == e ? m : static_cast<int64_t>(m * acc / total);
  }
  return off;
}

StatusOr<Tensor> ExpertOf(const Tensor& w, int64_t e) {
  ORRERY_ASSIGN_OR_RETURN(Tensor one, w.Slice(e, e + 1));
  return one.Reshape({w.dim(1), w.dim(2)});
}

// One shape: M rows of E experts, W [E, N, K].
void Bench(const std::string& name, int64_t m, int64_t e, int64_t n, int64_t k, bool forward_only) {
  const std::vector<int64_t> off = Offsets(m, e, 7 + e + n);
  const Tensor off_dev = Tensor::FromVector<int64_t>({e + 1}, off).To(Device::Cuda(0)).value();
  const Tensor x = RandomOnGpu({m, k}, DType::kBF16, 1), dy = RandomOnGpu({m, n}, DType::kBF16, 2);
  const Tensor w = RandomOnGpu({e, n, k}, DType::kBF16, 3);
  Tensor y = RandomOnGpu({m, n}, DType::kBF16, 4), dx = RandomOnGpu({m, k}, DType::kF32, 5);
  Tensor dw = RandomOnGpu({e, n, k}, DType::kF32, 6);
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
  const char* products[] = {"Y = X W_e^T (bf16 out)", "dX = dY W_e (f32 out)",
                            "dW_e += dY^T X (f32)"};
  const double flops = 2.0 * m * n * k;
  for (int product = 0; product < (forward_only ? 1 : 3); ++product) {
    const double g = TimeMs([&] { return grouped(product); });
    const double l = TimeMs([&] { return loop(product); });
    std::printf(
        "%-28s %-24s M %7lld E %4lld N %5lld K %5lld  grouped %8.3f ms %6.1f TFLOP/s  "
        "loop %8.3f ms %6.1f TFLOP/s  x%.2f\n",
        name.c_str(), products[product], static_cast<long long>(m), static_cast<long long>(e),
        static_cast<long long>(n), static_cast<long long>(k), g, flops / (g * 1e-3) / 1e12, l,
        flops / (l * 1e-3) / 1e12, l / g);
  }
}

int Run() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is measured
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "grouped_gemm_gpu_bench: no CUDA device\n");
    return 1;
  }
  Bench("small", 131072, 32, 512, 512, false);
  Bench("bench-1b gate/up [F, L]", 131072, 64, 512, 768, false);
  Bench("bench-1b down [L, F]", 131072, 64, 768, 512, false);
  for (int64_t rows : {128, 512, 2048, 8192}) {
    Bench("anchor " + std::to_string(rows) + " rows/expert", 32 * rows, 32, 1024, 1024, true);
  }
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main() { return orrery::kernels::Run(); }
