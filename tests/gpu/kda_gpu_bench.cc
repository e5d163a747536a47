// KDA on the GPU: forward and forward+backward time at the shapes, decode state bandwidth,
// copy bandwidth.
//
// Prints one line per case (medians of CUDA-event timings after a warm-up); scripts/gpu_kda.sh
// runs it next to fla's chunk_kda and docs/benchmarks.md records both.
//
//   kda_gpu_bench [--shape B,T,H,D]... [--quick] [--no-decode]
//
// --shape replaces the three shapes (repeatable); --quick times only the forward and
// forward+backward (no stage split, no original gate), as a profiler run wants.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/cuda/kda_cuda.h"
#include "kernels/kda.h"
#include "kernels/kda_problem.h"

namespace orrery::kernels {
namespace {

#define CHECK_CUDA(x)                                              \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

// A [rows, width] tensor on the GPU filled by repeating a 1M-element random block (unit rows
// when `unit`, uniform in [lo, hi) otherwise), converted to `dtype`.
Tensor Fill(const Shape& shape, DType dtype, uint64_t seed, bool unit, float lo, float hi) {
  const int64_t width = shape.back(), numel = ShapeNumel(shape);
  const int64_t block = std::min<int64_t>(numel, (int64_t{1} << 20) / width * width);
  PhiloxGenerator rng(seed, 0);
  std::vector<float> b(block);
  for (int64_t i = 0; i < block; ++i) b[i] = unit ? rng.Normal() : lo + (hi - lo) * rng.Uniform();
  if (unit) {
    for (int64_t r = 0; r < block / width; ++r) {
      float ss = 0;
      for (int64_t d = 0; d < width; ++d) ss += b[r * width + d] * b[r * width + d];
      for (int64_t d = 0; d < width; ++d) b[r * width + d] /= std::sqrt(ss);
    }
  }
  Tensor host = Tensor::Empty({block}, DType::kF32);
  std::copy(b.begin(), b.end(), host.data<float>());
  Tensor h = host.Cast(dtype).value();
  Tensor dev = Tensor::Allocate(shape, dtype, Device::Cuda(0)).value();
  const size_t bb = h.nbytes();
  for (int64_t off = 0; off < numel; off += block) {
    const int64_t n = std::min(block, numel - off);
    CHECK_CUDA(cudaMemcpy(static_cast<char*>(dev.raw_data()) + off * DTypeSize(dtype), h.raw_data(),
                          std::min<size_t>(bb, n * DTypeSize(dtype)), cudaMemcpyHostToDevice));
  }
  return dev;
}

double MedianMs(const std::function<void()>& fn, int reps) {
  fn();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> t;
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    fn();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

struct BenchArgs {
  std::vector<std::array<int64_t, 4>> shapes;
  bool quick = false;
  bool decode = true;
};

// One line and exit code 2 on a bad argument.
BenchArgs ParseArgs(int argc, char** argv) {
  BenchArgs a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      a.quick = true;
    } else if (arg == "--no-decode") {
      a.decode = false;
    } else if (arg == "--shape" && i + 1 < argc) {
      std::array<int64_t, 4> s{};
      long long b, t, h, d;
      if (std::sscanf(argv[++i], "%lld,%lld,%lld,%lld", &b, &t, &h, &d) != 4 || b < 1 || t < 1 ||
          h < 1 || (d != 64 && d != 128)) {
        std::fprintf(stderr, "kda_gpu_bench: --shape %s: expected B,T,H,D with D 64 or 128\n",
                     argv[i]);
        std::exit(2);
      }
      s = {b, t, h, d};
      a.shapes.push_back(s);
    } else {
      std::fprintf(stderr,
                   "kda_gpu_bench: unknown argument %s (--shape B,T,H,D, --quick, "
                   "--no-decode)\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  if (a.shapes.empty()) a.shapes = {{8, 8192, 16, 128}, {1, 65536, 16, 128}, {1, 8192, 96, 128}};
  return a;
}

int Main(const BenchArgs& args) {
  // Copy bandwidth: 2 GiB device to device, bytes read + written.
  {
    const size_t bytes = size_t{2} << 30;
    void *x, *y;
    CHECK_CUDA(cudaMalloc(&x, bytes));
    CHECK_CUDA(cudaMalloc(&y, bytes));
    CHECK_CUDA(cudaMemset(x, 1, bytes));
    const double ms =
        MedianMs([&] { CHECK_CUDA(cudaMemcpy(y, x, bytes, cudaMemcpyDeviceToDevice)); }, 10);
    std::printf("copy bytes=%zu ms=%.3f GB/s=%.0f\n", bytes, ms, 2.0 * bytes / ms / 1e6);
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
  }
  for (const auto& s : args.shapes) {
    const int64_t b = s[0], t = s[1], h = s[2], d = s[3];
    KdaInputs in;
    in.q = Fill({b, t, h, d}, DType::kBF16, 1, true, 0, 0);
    in.k = Fill({b, t, h, d}, DType::kBF16, 2, true, 0, 0);
    in.v = Fill({b, t, h, d}, DType::kBF16, 3, false, -1, 1);
    in.g = Fill({b, t, h, d}, DType::kF32, 4, false, -5, 0);
    in.beta = Fill({b, t, h}, DType::kBF16, 5, false, 0.05f, 0.95f);
    KdaOutputs out;
    KdaOptions options;
    const double ms = MedianMs([&] { Check(KdaForward(in, options, &out)); }, 10);
    const double tflops = 182e3 * b * t * h / ms / 1e9;  // spec §2.7 F_fwd(64) per token-head
    std::printf("orrery fwd B=%lld T=%lld H=%lld K=V=%lld ms=%.3f (%.1f TFLOP/s by spec 2.7)\n",
                (long long)b, (long long)t, (long long)h, (long long)d, ms, tflops);
    // The tensor-core forward's parts: stage 1 alone (chunk preparation), and the state pass
    // with 1 (unsplit) or a fixed number of segments per sequence.
    if (!args.quick) {
      const KdaProblem p = ValidateKdaInputs(in, options).value();
      auto tc = [&](int segments, bool prep_only) {
        cuda::KdaTcTuning tuning;
        tuning.segments_per_sequence = segments;
        tuning.prep_only = prep_only;
        return MedianMs([&] { Check(cuda::LaunchKdaForwardTc(p, in, tuning, &out)); }, 10);
      };
      std::printf("orrery fwd-parts B=%lld T=%lld H=%lld prep_ms=%.3f", (long long)b, (long long)t,
                  (long long)h, tc(0, true));
      for (int segs : {1, 4, 8, 16, 32}) std::printf(" segs%d_ms=%.3f", segs, tc(segs, false));
      std::printf("\n");
    }
    // Original gate with strong decays, g in (-20, 0): every diagonal 16-token tile spans more
    // than the tensor-core bound and is formed pairwise (what the bounded gate saves).
    if (!args.quick) {
      KdaInputs orig = in;
      orig.g = Fill({b, t, h, d}, DType::kF32, 7, false, -20, 0);
      const double oms = MedianMs([&] { Check(KdaForward(orig, options, &out)); }, 10);
      std::printf("orrery fwd-original-gate B=%lld T=%lld H=%lld ms=%.3f\n", (long long)b,
                  (long long)t, (long long)h, oms);
    }
    // Backward alone and by stage (cumulative: the forward recompute, + the reverse state pass,
    // + the chunk kernel), then forward + backward as training
    // runs it: the layer keeps nothing but the inputs, so the backward's recompute is part of its
    // cost.
    Tensor d_o = Fill({b, t, h, d}, DType::kBF16, 6, false, -1, 1);
    KdaGrads grads;
    if (!args.quick) {
      const KdaProblem p = ValidateKdaInputs(in, options).value();
      auto stage = [&](int stages) {
        cuda::KdaTcTuning tuning;
        tuning.backward_stages = stages;
        return MedianMs(
            [&] { Check(cuda::LaunchKdaBackwardTc(p, in, d_o, Tensor(), tuning, &grads)); }, 10);
      };
      std::printf(
          "orrery bwd-parts B=%lld T=%lld H=%lld recompute_ms=%.3f +reverse_pass_ms=%.3f "
          "+chunk_kernel_ms=%.3f\n",
          (long long)b, (long long)t, (long long)h, stage(1), stage(2), stage(0));
    }
    const double b_ms =
        MedianMs([&] { Check(KdaBackward(in, d_o, Tensor(), options, &grads)); }, 10);
    std::printf("orrery bwd B=%lld T=%lld H=%lld K=V=%lld ms=%.3f\n", (long long)b, (long long)t,
                (long long)h, (long long)d, b_ms);
    const double fb_ms = MedianMs(
        [&] {
          Check(KdaForward(in, options, &out));
          Check(KdaBackward(in, d_o, Tensor(), options, &grads));
        },
        10);
    std::printf("orrery fwdbwd B=%lld T=%lld H=%lld K=V=%lld ms=%.3f\n", (long long)b, (long long)t,
                (long long)h, (long long)d, fb_ms);
    // The same with the forward keeping its intermediates (KdaOptions::keep_for_backward): the
    // backward skips its recompute.
    KdaOptions keep = options;
    keep.keep_for_backward = true;
    const double fbk_ms = MedianMs(
        [&] {
          Check(KdaForward(in, keep, &out));
          Check(KdaBackward(in, d_o, Tensor(), options, &grads, out.saved.get()));
        },
        10);
    out.saved.reset();
    std::printf("orrery fwdbwd-kept B=%lld T=%lld H=%lld K=V=%lld ms=%.3f\n", (long long)b,
                (long long)t, (long long)h, (long long)d, fbk_ms);
    if (!args.quick) {
      // Its two calls apart (what the pair costs beyond them: the gaps between the calls), and
      // with the segment split forced when the automatic choice splits (the backward takes the
      // forward's segments).
      const double fk_ms = MedianMs([&] { Check(KdaForward(in, keep, &out)); }, 10);
      const double bk_ms = MedianMs(
          [&] { Check(KdaBackward(in, d_o, Tensor(), options, &grads, out.saved.get())); }, 10);
      out.saved.reset();
      std::printf("orrery fwdbwd-kept-parts B=%lld T=%lld H=%lld fwd_kept_ms=%.3f bwd_kept_ms=%.3f",
                  (long long)b, (long long)t, (long long)h, fk_ms, bk_ms);
      const KdaProblem p = ValidateKdaInputs(in, options).value();
      if (cuda::KdaTcSegmentsPerSequence(cuda::KdaTcTuning(), b * h * (d / 64), (t + 63) / 64) >
          1) {
        for (int segs : {4, 6, 8, 12, 16}) {
          cuda::KdaTcTuning tuning;
          tuning.segments_per_sequence = segs;
          const double ms = MedianMs(
              [&] {
                cuda::KdaTcSaved saved;
                KdaOutputs o;
                o.o = out.o;
                Check(cuda::LaunchKdaForwardTc(p, in, tuning, &o, &saved));
                Check(cuda::LaunchKdaBackwardTc(p, in, d_o, Tensor(), tuning, &grads, &saved));
              },
              10);
          std::printf(" segs%d_ms=%.3f", segs, ms);
        }
      }
      std::printf("\n");
    }
    // fla's inputs: raw bf16 q, k (the op normalises them), the gate's bf16 pre-activation with
    // A_log and dt_bias, beta logits; every transform in the op (KdaInputTransforms).
    if (!args.quick) {
      KdaInputs raw = in;
      raw.q = Fill({b, t, h, d}, DType::kBF16, 8, false, -1, 1);
      raw.k = Fill({b, t, h, d}, DType::kBF16, 9, false, -1, 1);
      raw.g = Fill({b, t, h, d}, DType::kBF16, 10, false, -3, 3);
      raw.beta = Fill({b, t, h}, DType::kBF16, 11, false, -3, 3);
      raw.a_log = Fill({h}, DType::kF32, 12, false, -1, 0.5f);
      raw.dt_bias = Fill({h * d}, DType::kF32, 13, false, -1, 1);
      KdaOptions tr = options;
      tr.transforms.qk_l2norm = tr.transforms.beta_sigmoid = tr.transforms.gate = true;
      const double tf_ms = MedianMs([&] { Check(KdaForward(raw, tr, &out)); }, 10);
      KdaOptions tr_keep = tr;
      tr_keep.keep_for_backward = true;
      const double tfb_ms = MedianMs(
          [&] {
            Check(KdaForward(raw, tr_keep, &out));
            Check(KdaBackward(raw, d_o, Tensor(), tr, &grads, out.saved.get()));
          },
          10);
      out.saved.reset();
      std::printf(
          "orrery transforms-in-op B=%lld T=%lld H=%lld K=V=%lld fwd_ms=%.3f fwdbwd-kept_ms=%.3f\n",
          (long long)b, (long long)t, (long long)h, (long long)d, tf_ms, tfb_ms);
    }
    if (!args.quick) {
      KdaInputs orig = in;
      orig.g = Fill({b, t, h, d}, DType::kF32, 7, false, -20, 0);
      const double oms = MedianMs(
          [&] {
            Check(KdaForward(orig, options, &out));
            Check(KdaBackward(orig, d_o, Tensor(), options, &grads));
          },
          10);
      std::printf("orrery fwdbwd-original-gate B=%lld T=%lld H=%lld ms=%.3f\n", (long long)b,
                  (long long)t, (long long)h, oms);
    }
  }
  for (int64_t n : args.decode ? std::vector<int64_t>{1, 64, 256} : std::vector<int64_t>{}) {
    const int64_t h = 32, d = 128;
    Tensor q = Fill({n, h, d}, DType::kBF16, 1, true, 0, 0),
           k = Fill({n, h, d}, DType::kBF16, 2, true, 0, 0);
    Tensor v = Fill({n, h, d}, DType::kBF16, 3, false, -1, 1),
           g = Fill({n, h, d}, DType::kF32, 4, false, -5, 0);
    Tensor beta = Fill({n, h}, DType::kBF16, 5, false, 0.05f, 0.95f);
    Tensor state = Fill({n, h, d, d}, DType::kF32, 6, false, -1, 1), o;
    Check(KdaDecodeStep(q, k, v, g, beta, 0.0f, &state, &o));
    // One step alone (its launch latency included), and steps queued back to back as a decode
    // loop runs them (per step: the kernel's own time).
    const double ms =
        MedianMs([&] { Check(KdaDecodeStep(q, k, v, g, beta, 0.0f, &state, &o)); }, 50);
    constexpr int kSteps = 20;
    const double loop_ms = MedianMs(
                               [&] {
                                 for (int i = 0; i < kSteps; ++i)
                                   Check(KdaDecodeStep(q, k, v, g, beta, 0.0f, &state, &o));
                               },
                               10) /
                           kSteps;
    const double bytes = 2.0 * n * h * d * d * 4;
    std::printf(
        "orrery decode N=%lld H=%lld K=V=%lld ms=%.4f state GB/s=%.0f; in a loop of %d steps: "
        "ms/step=%.4f state GB/s=%.0f\n",
        (long long)n, (long long)h, (long long)d, ms, bytes / ms / 1e6, kSteps, loop_ms,
        bytes / loop_ms / 1e6);
  }
  return 0;
}

}  // namespace
}  // namespace orrery::kernels

int main(int argc, char** argv) {
  return orrery::kernels::Main(orrery::kernels::ParseArgs(argc, argv));
}
