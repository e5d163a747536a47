// Times the GPU model's whole Stable LatentMoE layer (model::gpu::GpuMoe: fp32 router, top-k,
// latent down-projection, the routed experts through kernels::MoeExperts, latent RMSNorm,
// up-projection, shared expert) forward and forward + backward, bf16 compute copies with fp32
// masters and gradients, as the GPU model runs it. Issue 24's layer benchmark; its anchor is
// scripts/gpu_moe_torch.py (the same maths in PyTorch over torch._grouped_mm) run in the same call.
//
// Shapes (TOKENS = 16384 unless given): bench-1b's layer (d 1536, latent 768, 64 experts top-8 of
// width 512, shared 1536) and a fine-grained one (d 2048, latent 1024, 128 experts top-8 of width
// 384, shared 1024). Weights N(0, 1/fan_in), inputs N(0, 1), no balancing bias: the router's
// logits are N(0, 1), so the routing is about uniform over the experts, as balancing makes it.
// FLOPs counted: 2 per multiply-add of the router, down, routed experts (3 products of top-k rows),
// up and shared products; the backward as twice the forward (dX and dW of every product).
// Median of 10 runs after 3 warm-ups by CUDA events; random inputs are drawn once, outside the
// timing. After the timed runs, one more forward + backward under the phase profile
// (kernels/phase_profile.h): device time per op of the layer (with the side stream on, the shared
// expert's phases overlap the routed path's). ORRERY_GROUPED_GEMM (kernels/grouped_gemm.h) chooses
// the expert GEMM kernel when set; ORRERY_SIDE_STREAM=0 keeps the shared expert on the device's
// stream (core/cuda_side_stream.h).
//
//   moe_layer_gpu_bench [TOKENS]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cuda_allocator.h"
#include "core/device.h"
#include "kernels/gates.h"
#include "kernels/phase_profile.h"
#include "model/gpu/gpu_layers.h"
#include "tests/gpu/gpu_bench_util.h"

namespace orrery::model::gpu {
namespace {

struct LayerShape {
  const char* name;
  int64_t d, latent, experts, top_k, width, shared;
};

double ForwardFlopsPerToken(const LayerShape& s) {
  return 2.0 * (s.d * s.experts + 2 * s.d * s.latent + s.top_k * 3 * s.latent * s.width +
                3 * s.d * s.shared);
}

// A weight of `shape` drawn N(0, 1 / shape.back()) on the device, its fp32 gradient zeroed and its
// bf16 compute copy.
StatusOr<Weight> RandomWeight(const Shape& shape, uint64_t seed) {
  const Device dev = Device::Cuda(0);
  Weight w;
  ORRERY_ASSIGN_OR_RETURN(w.master, ZerosOn(shape, DType::kF32, dev));
  const Tensor draw = kernels::gpu_bench::RandomOnGpu(shape, DType::kF32, seed);
  ORRERY_RETURN_IF_ERROR(
      kernels::AddInto(draw, static_cast<float>(1.0 / std::sqrt(shape.back())), &w.master));
  ORRERY_ASSIGN_OR_RETURN(w.grad, ZerosOn(shape, DType::kF32, dev));
  ORRERY_ASSIGN_OR_RETURN(w.compute, As(w.master, DType::kBF16));
  return w;
}

Status Bench(const LayerShape& s, int64_t tokens) {
  ModelConfig c;
  c.hidden_size = s.d;
  c.rms_norm_eps = 1e-5;
  c.moe.num_experts = s.experts;
  c.moe.top_k = s.top_k;
  c.moe.expert_intermediate = s.width;
  c.moe.latent_dim = s.latent;
  c.moe.latent_norm = true;
  c.moe.num_shared_experts = 1;
  c.moe.shared_intermediate = s.shared;
  c.moe.routed_scaling_factor = 1.0;
  c.activation = Activation::kSitu;  // beta 4, linear beta 25 (the defaults)
  const int64_t e = s.experts, f = s.width, l = s.latent, d = s.d, fs = s.shared;
  const std::pair<std::string, Shape> shapes[] = {
      {"router", {e, d}},        {"down", {l, d}},          {"up", {d, l}},
      {"experts.w1", {e, f, l}}, {"experts.w3", {e, f, l}}, {"experts.w2", {e, l, f}},
      {"shared.w1", {fs, d}},    {"shared.w3", {fs, d}},    {"shared.w2", {d, fs}}};
  WeightTable table;
  uint64_t seed = 11;
  for (const auto& [name, shape] : shapes) {
    ORRERY_ASSIGN_OR_RETURN(Weight w, RandomWeight(shape, seed++));
    table.Put("moe." + name, w);
  }
  Weight norm;
  ORRERY_ASSIGN_OR_RETURN(
      norm.master, Tensor::FromVector<float>({l}, std::vector<float>(l, 1.0f)).To(Device::Cuda(0)));
  ORRERY_ASSIGN_OR_RETURN(norm.grad, ZerosOn({l}, DType::kF32, Device::Cuda(0)));
  ORRERY_ASSIGN_OR_RETURN(norm.compute, As(norm.master, DType::kBF16));
  table.Put("moe.latent_norm", norm);
  GpuMoe layer;
  ORRERY_RETURN_IF_ERROR(layer.Init(table, c, "moe"));
  const Tensor x = kernels::gpu_bench::RandomOnGpu({tokens, d}, DType::kBF16, 3);
  const Tensor dy = kernels::gpu_bench::RandomOnGpu({tokens, d}, DType::kBF16, 4);
  ORRERY_ASSIGN_OR_RETURN(const Tensor bias, ZerosOn({e}, DType::kF32, Device::Cuda(0)));
  auto forward = [&]() -> Status {
    Tensor y;
    GpuMoe::Cache cache;
    return layer.Forward(x, bias, Tensor(), &y, &cache);
  };
  auto forward_backward = [&]() -> Status {
    Tensor y;
    GpuMoe::Cache cache;
    ORRERY_RETURN_IF_ERROR(layer.Forward(x, bias, Tensor(), &y, &cache));
    ORRERY_ASSIGN_OR_RETURN(Tensor dx, ZerosOn({tokens, d}, DType::kF32, Device::Cuda(0)));
    return layer.Backward(cache, dy, &dx);
  };
  const double fwd = kernels::gpu_bench::TimeMs(forward, 3, 10);
  const double both = kernels::gpu_bench::TimeMs(forward_backward, 3, 10);
  if (fwd < 0 || both < 0) return InternalError(std::string("moe layer ") + s.name + " failed");
  const double flops = ForwardFlopsPerToken(s) * static_cast<double>(tokens);
  const char* kernel = std::getenv("ORRERY_GROUPED_GEMM");
  const char* side = std::getenv("ORRERY_SIDE_STREAM");
  std::printf(
      "moe layer %-14s tokens %6lld d %5lld latent %5lld E %4lld top-%lld width %4lld shared %5lld "
      "gemm %-7s side stream %-3s  fwd %8.3f ms %9.0f tok/s %6.1f TFLOP/s  fwd+bwd %8.3f ms %9.0f "
      "tok/s "
      "%6.1f TFLOP/s  peak %.2f GiB\n",
      s.name, static_cast<long long>(tokens), static_cast<long long>(d), static_cast<long long>(l),
      static_cast<long long>(e), static_cast<long long>(s.top_k), static_cast<long long>(f),
      static_cast<long long>(fs), kernel != nullptr ? kernel : "default",
      side != nullptr && std::string(side) == "0" ? "off" : "on", fwd, tokens / (fwd * 1e-3),
      flops / (fwd * 1e-3) / 1e12, both, tokens / (both * 1e-3), 3 * flops / (both * 1e-3) / 1e12,
      GetCachingAllocatorStats(0).peak_bytes_in_use / 1073741824.0);
  ORRERY_RETURN_IF_ERROR(kernels::PhaseProfile::Start(Device::Cuda(0)));
  const Status profiled = forward_backward();
  ORRERY_ASSIGN_OR_RETURN(const auto times, kernels::PhaseProfile::Stop());
  ORRERY_RETURN_IF_ERROR(profiled);
  std::printf("profiled fwd+bwd (%% of the timed %.3f ms):\n%s", both,
              kernels::PhaseProfile::Format(times, both).c_str());
  return Status::OK();
}

int Run(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "moe_layer_gpu_bench: no CUDA device\n");
    return 1;
  }
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 16384;
  if (tokens < 1) {
    std::fprintf(stderr, "moe_layer_gpu_bench: TOKENS must be a positive integer, got '%s'\n",
                 argv[1]);
    return 2;
  }
  const LayerShape shapes[] = {{"bench-1b", 1536, 768, 64, 8, 512, 1536},
                               {"fine-grained", 2048, 1024, 128, 8, 384, 1024}};
  int rc = 0;
  for (const LayerShape& s : shapes) {
    const Status st = Bench(s, tokens);
    if (!st.ok()) {
      std::fprintf(stderr, "moe_layer_gpu_bench: %s\n", st.ToString().c_str());
      rc = 1;
    }
  }
  return rc;
}

}  // namespace
}  // namespace orrery::model::gpu

int main(int argc, char** argv) { return orrery::model::gpu::Run(argc, argv); }
