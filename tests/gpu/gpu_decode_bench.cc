// Decode throughput of the GPU inference engine (model/gpu/gpu_inference.h) against its roofline,
// for a model config with random weights.
//
//   gpu_decode_bench [CONFIG] [CONTEXT] [bf16|f32] [BATCH...]
//     defaults: configs/model/small.toml 4096 bf16 1 16 64 256
//
// Every slot is prefilled with its own random prompt of CONTEXT tokens (16 slots per Prefill
// call). Then for each batch size B, over slots 0..B-1, three ways of running the same decode
// step on one state (GpuInferenceState::set_decode), each DecodeAndSample (temperature 1, no
// nucleus: the agent loop's default; only ids, log-probs and expert ids come back):
//   pass:  the general inference pass (per-call host index arrays, the chunked KDA op, the state
//          gathered and scattered): the path before this work, the baseline;
//   eager: the fixed-shape step launched op by op;
//   graph: the same step replayed from its CUDA graph (captured at the bucket's second use).
// 2 warm-up steps (3 for graphs: eager, capture, replay) then 10 timed steps each, wall clock per
// call as the callers see it (the copy back synchronises). Slots grow by 37 tokens per batch size.
//
// Roofline: the bytes one step must move at least, over the device-to-device copy bandwidth this
// binary measures (1 GiB cudaMemcpyAsync, read + write counted): the weights it touches once
// (compute copies, the fp32 router, B rows of the embedding, and of each MoE layer only the
// experts the step's tokens were routed to: the mean over the timed steps of the distinct experts
// in each step's expert ids), the KDA states and conv
// histories read and written, and every slot's latent pages read (context x (dc + dr) per MLA
// layer). The compute bound is far below it at these batch sizes and is not printed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "core/cuda_allocator.h"
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

// Device-to-device copy bandwidth in bytes/s, read + write counted (the median of 10).
double CopyBandwidth() {
  constexpr size_t kBytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, kBytes) != cudaSuccess || cudaMalloc(&b, kBytes) != cudaSuccess) return 0;
  cudaStream_t stream = *CudaStream(0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0, stream);
    cudaMemcpyAsync(b, a, kBytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  std::sort(ms.begin(), ms.end());
  return 2.0 * kBytes / (ms[ms.size() / 2] * 1e-3);
}

// The bytes a decode step of b slots at `context` tokens each reads and writes at least, with
// `routed[l]` the mean number of distinct experts MoE layer l's tokens went to per step.
double StepBytes(model::GpuModel& m, int64_t b, int64_t context,
                 const std::vector<double>& routed) {
  const model::ModelConfig& c = m.config();
  double bytes = 0;
  for (const model::GpuParameter& p : m.parameters()) {
    const double n = static_cast<double>(p.master.numel());
    const size_t at = p.name.find(".experts.");
    if (p.name == "embed") {
      bytes += static_cast<double>(b * c.hidden_size) * 2;
    } else if (p.name.find(".router") != std::string::npos) {
      bytes += n * 4;  // the router runs on the fp32 master
    } else if (at != std::string::npos) {
      // "layers.L.moe.experts.E.w1": each expert's share of the experts a step touches.
      const int64_t moe = std::atoll(p.name.c_str() + 7) - c.first_k_dense;
      if (moe >= 0 && moe < static_cast<int64_t>(routed.size())) {
        bytes += n * 2 * routed[static_cast<size_t>(moe)] / static_cast<double>(c.moe.num_experts);
      }
    } else {
      bytes += n * 2;
    }
  }
  int64_t kda = 0, mla = 0;
  for (model::LayerKind k : c.layers) (k == model::LayerKind::kKda ? kda : mla) += 1;
  const double state = static_cast<double>(c.kda.heads * c.kda.head_k_dim * c.kda.head_v_dim) * 4;
  const double conv =
      static_cast<double>((c.kda.conv_size - 1) * (2 * c.kda_key_width() + c.kda_value_width())) *
      2;
  bytes += static_cast<double>(kda * b) * 2 * (state + conv);  // read and written
  bytes += static_cast<double>(mla * b * context) *
           static_cast<double>(c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) * 2;
  return bytes;
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
  if (batches.empty()) batches = {1, 16, 64, 256};
  int64_t slots = 1;
  for (int64_t b : batches) slots = std::max(slots, b);
  constexpr int kSteps = 10, kGrowth = 40;

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
  io.max_tokens_per_slot = context + kGrowth * static_cast<int64_t>(batches.size());
  auto state = model::GpuInferenceState::Create(gpu->get(), io);
  if (!state.ok()) return Fail(state.status());
  const double bandwidth = CopyBandwidth();
  PhiloxGenerator gen(5, 0);
  const int64_t vocab = config->vocab_size;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s0 = 0; s0 < slots; s0 += 16) {
    std::vector<int64_t> group;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t s = s0; s < std::min(slots, s0 + 16); ++s) {
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
      "%s %s: %lld slots prefilled to %lld tokens in %.2f s (%.0f tokens/s); state %.2f GB; "
      "D2D copy %.0f GB/s (read + write)\n",
      config->name.c_str(), std::string(DTypeName(dtype)).c_str(), static_cast<long long>(slots),
      static_cast<long long>(context), prefill_s, static_cast<double>(slots * context) / prefill_s,
      (*state)->bytes() / 1e9, bandwidth / 1e9);
  std::printf(
      "  batch  context | pass ms | eager ms | graph ms  tokens/s | roofline ms (GB/step) | "
      "graph / roofline | vs pass\n");
  using Mode = model::GpuInferenceOptions::Decode;
  for (int64_t b : batches) {
    std::vector<int64_t> which;
    std::vector<model::TokenDraw> draws;
    for (int64_t s = 0; s < b; ++s) which.push_back(s);
    // Per MoE layer, the distinct experts of each step summed over the timed steps.
    std::vector<double> routed(static_cast<size_t>(config->num_moe_layers()), 0.0);
    int64_t counted = 0;
    auto step = [&]() -> Status {
      draws.clear();
      for (int64_t s = 0; s < b; ++s) draws.push_back({1.0, 1.0, gen.Uniform()});
      ORRERY_ASSIGN_OR_RETURN(model::SampledStep out,
                              (*state)->DecodeAndSample(which, Random(b, vocab, gen), draws));
      const int64_t k = config->moe.top_k;
      for (size_t l = 0; l < routed.size(); ++l) {
        const int32_t* ids = out.expert_ids.data<int32_t>() + static_cast<int64_t>(l) * b * k;
        routed[l] += static_cast<double>(std::set<int32_t>(ids, ids + b * k).size());
      }
      ++counted;
      return Status::OK();
    };
    auto time = [&](Mode mode, int warmup) -> StatusOr<double> {
      (*state)->set_decode(mode);
      for (int i = 0; i < warmup; ++i) ORRERY_RETURN_IF_ERROR(step());
      std::fill(routed.begin(), routed.end(), 0.0);
      counted = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kSteps; ++i) ORRERY_RETURN_IF_ERROR(step());
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                 .count() /
             kSteps;
    };
    auto pass = time(Mode::kPass, 2);
    if (!pass.ok()) return Fail(pass.status());
    auto eager = time(Mode::kEager, 2);
    if (!eager.ok()) return Fail(eager.status());
    const int64_t replays = (*state)->decode_stats().graph_replays;
    auto graph = time(Mode::kGraph, 3);
    if (!graph.ok()) return Fail(graph.status());
    const bool replayed = (*state)->decode_stats().graph_replays - replays >= kSteps;
    double mean_routed = 0;
    for (double& r : routed) {
      r /= static_cast<double>(std::max<int64_t>(counted, 1));
      mean_routed += r;
    }
    const double bytes = StepBytes(**gpu, b, (*state)->length(0), routed);
    const double roof_ms = bytes / bandwidth * 1e3;
    std::printf(
        "  %5lld  %7lld | %7.2f | %8.2f | %8.2f %9.0f | %11.3f (%6.3f) | %15.1f%% | %6.1fx%s\n",
        static_cast<long long>(b), static_cast<long long>((*state)->length(0)), *pass, *eager,
        *graph, 1000.0 * static_cast<double>(b) / *graph, roof_ms, bytes / 1e9,
        100.0 * roof_ms / *graph, *pass / *graph, replayed ? "" : "  (graph NOT replayed)");
    std::printf("         (distinct experts per MoE layer and step: %.1f of %lld)\n",
                mean_routed / std::max<double>(1.0, static_cast<double>(routed.size())),
                static_cast<long long>(config->moe.num_experts));
  }
  const model::DecodeStats& s = (*state)->decode_stats();
  std::printf("graphs: %lld captured (%lld nodes in all), %lld replays%s%s\n",
              static_cast<long long>(s.graph_captures), static_cast<long long>(s.graph_nodes),
              static_cast<long long>(s.graph_replays),
              s.graphs_off.empty() ? "" : "; off: ", s.graphs_off.c_str());
  return 0;
}
