// Training throughput of the GPU model (model/gpu/gpu_model.h): forward + backward + AdamW on the
// device for a model config at one sequence length, on fresh random tokens (never zeros).
//
//   gpu_model_bench CONFIG SEQ_LEN ROWS [STEPS] [bf16|f32] [recompute]
//
// Prints one line: tokens per step, ms per step, tokens/s, model TFLOP/s and MFU against the
// H200's 989 dense bf16 TFLOP/s, and the peak device memory of the caching allocator; then the
// phase profile (kernels/phase_profile.h) of one more step: device and host time per phase. FLOPs
// per token: 3 x the forward FLOPs of model/config.h's ComputeParamBreakdown at this context (2 per
// active matmul parameter plus the causal attention and KDA cores, spec §2.7), i.e. the usual
// 6 x active parameters plus the cores.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/phase_profile.h"
#include "learner/adamw.h"
#include "learner/gpu_trainable.h"
#include "model/config.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"

using namespace orrery;

namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "gpu_model_bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: gpu_model_bench CONFIG SEQ_LEN ROWS [STEPS] [bf16|f32] [recompute]\n");
    return 2;
  }
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "gpu_model_bench: no CUDA device\n");
    return 1;
  }
  const std::string path = argv[1];
  const int64_t seq = std::atoll(argv[2]), rows = std::atoll(argv[3]);
  const int steps = argc > 4 ? std::atoi(argv[4]) : 5;
  const DType dtype = argc > 5 && std::string(argv[5]) == "f32" ? DType::kF32 : DType::kBF16;
  auto config = model::LoadModelConfig(path);
  if (!config.ok()) return Fail(config.status());
  auto host = model::Model::Create(*config, 1, DType::kF32);
  if (!host.ok()) return Fail(host.status());
  model::GpuModelOptions o;
  o.compute_dtype = dtype;
  o.recompute_layers = argc > 6 && std::string(argv[6]) == "recompute";
  auto gpu = model::GpuModel::FromHost(**host, o);
  if (!gpu.ok()) return Fail(gpu.status());
  host->reset();  // the host copy is not needed any more
  GpuTrainable trainable(gpu->get());
  auto adamw = AdamW::Create(AdamWOptions{}, trainable.Parameters());
  if (!adamw.ok()) return Fail(adamw.status());
  PackedBatch batch;
  batch.rows = rows;
  batch.seq_len = seq;
  PhiloxGenerator gen(11, 0);
  for (int64_t i = 0; i < rows * seq; ++i) {
    batch.inputs.push_back(static_cast<int32_t>(gen.UniformInt(config->vocab_size)));
    batch.targets.push_back(static_cast<int32_t>(gen.UniformInt(config->vocab_size)));
  }
  for (int64_t r = 0; r <= rows; ++r) batch.cu_seqlens.push_back(static_cast<int32_t>(r * seq));
  batch.num_targets = rows * seq;
  auto step = [&]() -> Status {
    {
      kernels::PhaseScope scope("step.zero_grad");
      ORRERY_RETURN_IF_ERROR(adamw->ZeroGrad());
    }
    {
      kernels::PhaseScope scope("step.forward_backward");
      ORRERY_ASSIGN_OR_RETURN(LossSum l, trainable.ForwardBackward(batch, 1.0 / batch.num_targets));
      (void)l;
    }
    {
      kernels::PhaseScope scope("step.balancing");
      ORRERY_ASSIGN_OR_RETURN(auto balance, trainable.UpdateBalancing());
      (void)balance;
    }
    {
      kernels::PhaseScope scope("step.clip");
      ORRERY_ASSIGN_OR_RETURN(double norm, adamw->ClipGradNorm(1.0));
      (void)norm;
    }
    kernels::PhaseScope scope("step.adamw");
    return adamw->Step(1e-4);
  };
  // Two warm-up steps (allocator, cuBLASLt heuristics), then the timed ones; the loss read back
  // at the end of every ForwardBackward synchronises each step.
  for (int i = 0; i < 2; ++i) {
    if (Status s = step(); !s.ok()) return Fail(s);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    if (Status s = step(); !s.ok()) return Fail(s);
  }
  const double sec =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  const double tokens = static_cast<double>(rows * seq);
  const double flops =
      3.0 * model::ComputeParamBreakdown(*config, seq).forward_flops_per_token * tokens;
  const CachingAllocatorStats mem = GetCachingAllocatorStats(0);
  std::printf(
      "gpu_model %s %s%s seq %lld x %lld: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%%, "
      "peak %.1f GiB\n",
      config->name.c_str(), std::string(DTypeName(dtype)).c_str(),
      o.recompute_layers ? " recompute" : "", static_cast<long long>(rows),
      static_cast<long long>(seq), sec * 1e3, tokens / sec, flops / sec / 1e12,
      100.0 * flops / sec / 989e12, static_cast<double>(mem.peak_bytes_in_use) / (1 << 30));
  // One profiled step (events on the ops' stream; the profile's own cost is a few us per scope).
  if (Status s = kernels::PhaseProfile::Start(Device::Cuda(0)); !s.ok()) return Fail(s);
  const auto p0 = std::chrono::steady_clock::now();
  if (Status s = step(); !s.ok()) return Fail(s);
  auto times = kernels::PhaseProfile::Stop();
  if (!times.ok()) return Fail(times.status());
  const double step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count();
  std::printf("profiled step: %.1f ms wall\n%s", step_ms,
              kernels::PhaseProfile::Format(*times, step_ms).c_str());
  return 0;
}
