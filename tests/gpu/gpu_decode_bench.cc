// Decode throughput of the GPU inference engine (model/gpu/gpu_inference.h): batched DecodeStep
// over B slots each holding CONTEXT tokens, for a model config with random weights.
//
//   gpu_decode_bench [CONFIG] [CONTEXT] [bf16|f32] [BATCH...]
//     defaults: configs/model/small.toml 4096 bf16 1 16 64
//
// Every slot is prefilled with its own random prompt of CONTEXT tokens (8 slots per Prefill
// call), then for each batch size B: 2 warm-up steps and 20 timed steps over slots 0..B-1. The
// time is wall clock per DecodeStep call as the engine's callers see it (the logits copied to the
// host, i.e. synchronised), so it includes the host's bookkeeping and launch overhead. Slots grow
// by 22 tokens per batch size measured (contexts are CONTEXT + at most 66 tokens). Prints one line
// per batch size: ms per step, tokens/s, and the engine's device state bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "model/config.h"
#include "model/gpu/gpu_inference.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"

using namespace orrery;

namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "gpu_decode_bench: %s\n", s.ToString().c_str());
  return 1;
}

std::vector<int32_t> Random(int64_t n, int64_t vocab, PhiloxGenerator& gen) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = static_cast<int32_t>(gen.UniformInt(vocab));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "gpu_decode_bench: no CUDA device\n");
    return 1;
  }
  const std::string path = argc > 1 ? argv[1] : "configs/model/small.toml";
  const int64_t context = argc > 2 ? std::atoll(argv[2]) : 4096;
  const DType dtype = argc > 3 && std::string(argv[3]) == "f32" ? DType::kF32 : DType::kBF16;
  std::vector<int64_t> batches;
  for (int i = 4; i < argc; ++i) batches.push_back(std::atoll(argv[i]));
  if (batches.empty()) batches = {1, 16, 64};
  int64_t slots = 1;
  for (int64_t b : batches) slots = std::max(slots, b);
  constexpr int kWarmup = 2, kSteps = 20;

  auto config = model::LoadModelConfig(path);
  if (!config.ok()) return Fail(config.status());
  auto host = model::Model::Create(*config, 1, DType::kF32);
  if (!host.ok()) return Fail(host.status());
  model::GpuModelOptions mo;
  mo.compute_dtype = dtype;
  auto gpu = model::GpuModel::FromHost(**host, mo);
  if (!gpu.ok()) return Fail(gpu.status());
  host->reset();
  model::GpuInferenceOptions io;
  io.num_slots = slots;
  io.max_tokens_per_slot = context + (kWarmup + kSteps) * static_cast<int64_t>(batches.size());
  auto state = model::GpuInferenceState::Create(gpu->get(), io);
  if (!state.ok()) return Fail(state.status());
  PhiloxGenerator gen(5, 0);
  const int64_t vocab = config->vocab_size;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s0 = 0; s0 < slots; s0 += 8) {
    std::vector<int64_t> group;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t s = s0; s < std::min(slots, s0 + 8); ++s) {
      auto a = (*state)->Allocate();
      if (!a.ok()) return Fail(a.status());
      group.push_back(*a);
      prompts.push_back(Random(context, vocab, gen));
    }
    auto p = (*state)->Prefill(group, prompts);
    if (!p.ok()) return Fail(p.status());
  }
  const double prefill_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%s %s: %lld slots prefilled to %lld tokens in %.2f s (%.0f tokens/s); state %.2f GB\n",
      config->name.c_str(), std::string(DTypeName(dtype)).c_str(), static_cast<long long>(slots),
      static_cast<long long>(context), prefill_s, static_cast<double>(slots * context) / prefill_s,
      (*state)->bytes() / 1e9);
  for (int64_t b : batches) {
    std::vector<int64_t> which;
    for (int64_t s = 0; s < b; ++s) which.push_back(s);
    auto step = [&]() -> Status {
      return (*state)->DecodeStep(which, Random(b, vocab, gen)).status();
    };
    for (int i = 0; i < kWarmup; ++i) {
      if (Status s = step(); !s.ok()) return Fail(s);
    }
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kSteps; ++i) {
      if (Status s = step(); !s.ok()) return Fail(s);
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        kSteps;
    std::printf("  decode batch %4lld at ~%lld tokens: %8.2f ms/step  %10.0f tokens/s\n",
                static_cast<long long>(b), static_cast<long long>((*state)->length(0)), ms,
                1000.0 * static_cast<double>(b) / ms);
  }
  return 0;
}
