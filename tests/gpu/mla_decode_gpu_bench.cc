// Times absorbed MLA decode over a paged latent cache (kernels/mla_decode.h) on the GPU with CUDA
// events (median of 20 runs after 3 warm-ups, tests/gpu/gpu_bench_util.h): K3's shape (H = 16
// heads, Q = 1, rows of 576 bf16 = 512 latent + 64 rope, 64-token pages in shuffled order), at
// batch 1, 16, 64, 256 x context 4K and 64K, and batch 1 x 1M. Prints the time, the latent bytes
// read per second (batch x context x 576 x 2 bytes: every row once) and that as a share of the
// device-to-device copy bandwidth measured in the same run (cudaMemcpy of 1 GiB, counted as 2 GiB
// moved: each byte read and written once), with the automatic split and with splitting off.
// Batch 1 x 4K (4.7 MB) fits in L2 (50 MB on an H200): its repeats read from L2, not memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/mla_decode.h"
#include "tests/gpu/gpu_bench_util.h"

namespace orrery::kernels {
namespace {

using gpu_bench::RandomOnGpu;

double TimeMs(const std::function<Status()>& fn) { return gpu_bench::TimeMs(fn, 3, 20); }

// GB/s of a device-to-device copy of 1 GiB (2 GiB moved), median of 20.
double CopyGbps() {
  const int64_t bytes = int64_t{1} << 30;
  const Tensor src = RandomOnGpu({bytes / 2}, DType::kBF16, 77);
  Tensor dst = Tensor::Allocate({bytes / 2}, DType::kBF16, Device::Cuda(0)).value();
  const double ms = TimeMs([&] {
    const cudaError_t e =
        cudaMemcpy(dst.raw_data(), src.raw_data(), bytes, cudaMemcpyDeviceToDevice);
    return e == cudaSuccess ? Status::OK() : InternalError(cudaGetErrorString(e));
  });
  return ms > 0 ? 2.0 * bytes / (ms * 1e6) : -1;
}

int Run() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out as it is measured
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "mla_decode_gpu_bench: no CUDA device\n");
    return 1;
  }
  const double copy = CopyGbps();
  std::printf("device-to-device copy (1 GiB, read + write counted): %.0f GB/s\n", copy);
  constexpr int64_t kHeads = 16, kWidth = 576, kDv = 512, kPage = 64;
  const float scale = static_cast<float>(1.0 / std::sqrt(192.0));
  struct Shape2 {
    int64_t batch, context;
  };
  std::vector<Shape2> shapes;
  for (int64_t ctx : {int64_t{4096}, int64_t{65536}}) {
    for (int64_t b : {1, 16, 64, 256}) shapes.push_back({b, ctx});
  }
  shapes.push_back({1, int64_t{1} << 20});
  uint64_t seed = 1;
  for (const Shape2& s : shapes) {
    const int64_t per_seq = s.context / kPage, num_pages = s.batch * per_seq;
    PagedLatentCache cache;
    cache.pages = RandomOnGpu({num_pages, kPage, kWidth}, DType::kBF16, seed++);
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    PhiloxGenerator rng(seed++, 0);
    for (size_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[rng.UniformInt(i + 1)]);
    cache.block_table =
        Tensor::FromVector<int32_t>({s.batch, per_seq}, ids).To(Device::Cuda(0)).value();
    cache.context_lens =
        Tensor::FromVector<int32_t>({s.batch},
                                    std::vector<int32_t>(s.batch, static_cast<int32_t>(s.context)))
            .To(Device::Cuda(0))
            .value();
    const Tensor q = RandomOnGpu({s.batch, 1, kHeads, kWidth}, DType::kBF16, seed++);
    const double bytes = static_cast<double>(s.batch) * s.context * kWidth * 2;
    for (int splits : {0, 1}) {
      MlaDecodeOptions opt;
      opt.max_splits = splits;
      Tensor o, lse;
      const double ms = TimeMs([&] { return MlaDecodePaged(q, cache, kDv, scale, opt, &o, &lse); });
      const double gbps = ms > 0 ? bytes / (ms * 1e6) : -1;
      std::printf(
          "mla_decode bf16 H16 Q1 D576 batch %4lld context %8lld split %-4s %9.3f ms %7.0f GB/s "
          "%5.1f%% of copy\n",
          static_cast<long long>(s.batch), static_cast<long long>(s.context),
          splits == 0 ? "auto" : "off", ms, gbps, 100.0 * gbps / copy);
    }
  }
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main() { return orrery::kernels::Run(); }
