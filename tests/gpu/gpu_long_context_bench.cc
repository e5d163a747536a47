// Long-context prefill and decode of the GPU inference engine (model/gpu/gpu_inference.h) on one
// GPU, in the MHA-form prefill (mha_prefill_min_tokens 1024) and the absorbed form only (0),
// for a model config with random weights (default configs/model/small-1m.toml, bf16).
//
//   gpu_long_context_bench [--config PATH] [--lengths 8192,131072,1048576] [--chunk 8192]
//                          [--absorbed-budget-s 30] [--no-kernels] [--no-crossover]
//
// 1. Kernels (op level, CUDA events, median of 5 after 1 warm-up): a chunk of 8192 queries at the
//    end of a context of 8K, 64K and 1M keys, the model's MLA heads, as prefix-causal attention
//    (kernels::PrefixCausalAttention, qk dn + dr, v dv: the MHA form's attention) and as absorbed
//    attention over 64-token pages (kernels::MlaDecodePaged, rows dc + dr, output dc: the absorbed
//    form's), each with its FLOPs per (query, key) pair and head (2 (dqk + dv) and 2 (dc + dr) +
//    2 dc) and TFLOP/s. scripts/gpu_prefix_attention_torch.py times torch SDPA at the same shapes
//    (the anchor). Absorbed at 1M runs only if its 64K time scaled by the keys fits the budget.
// 2. Prefill and decode: per length L (capped at max_seq_len - 66 so that the decode fits) and
//    form, one slot prefilled with L random tokens in one Prefill call (chunks of --chunk), wall
//    clock as callers see it (the logits on the host): seconds, tokens/s, the peak device memory
//    of the caching allocator during the prefill (the model included) and the state's bytes; then
//    2 decode steps and 64 timed ones at that context: ms/token. The absorbed form runs at L only
//    when its estimate fits the budget, else it prints the estimate: the MHA form's time at L
//    (the rest of the model is the same) plus the forms' difference at the last length both ran,
//    times (L / L_prev)^2 (the attention's share).
// 3. Crossover (the rule's threshold): one Prefill of m = 256 .. 8192 tokens onto a slot holding
//    C = 0 or 65536 tokens (a copy of a prefilled slot: pages shared, so each m starts from the
//    same context), in each form; ms per call, and the smallest m from which the MHA form is
//    at least as fast at every C measured.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/mla_decode.h"
#include "model/config.h"
#include "model/gpu/gpu_inference.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"
#include "tests/gpu/gpu_bench_util.h"

using namespace orrery;

namespace {

constexpr int64_t kChunk = 8192, kDecodeSteps = 64, kDecodeWarmup = 2;
int64_t prefill_chunk = kChunk;  // --chunk

int Fail(const Status& s) {
  std::fprintf(stderr, "gpu_long_context_bench: %s\n", s.ToString().c_str());
  return 1;
}

std::vector<int32_t> Random(int64_t n, int64_t vocab, PhiloxGenerator& gen) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = static_cast<int32_t>(gen.UniformInt(static_cast<uint64_t>(vocab)));
  return out;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Gb(size_t bytes) { return static_cast<double>(bytes) / 1e9; }

// Query-key pairs of n queries at the end of a context of len keys (query i sees len - n + i + 1).
double Pairs(int64_t n, int64_t len) {
  return static_cast<double>(n) * static_cast<double>(len - n) +
         static_cast<double>(n) * static_cast<double>(n + 1) / 2;
}

struct Options {
  std::string config = "configs/model/small-1m.toml";
  std::vector<int64_t> lengths = {8192, 131072, 1048576};
  double absorbed_budget_s = 30;
  bool kernels = true, crossover = true;
};

// 1. The two forms' attention kernels on one chunk at the end of long contexts.
Status Kernels(const model::ModelConfig& c, double budget_s) {
  const int64_t h = c.mla.heads, dqk = c.mla_qk_head_dim(), dv = c.mla.v_head_dim;
  const int64_t dc = c.mla.kv_lora_rank, w = dc + c.mla.qk_rope_head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dqk));
  std::printf("kernels: %lld heads, a chunk of %lld queries at the end of the context, bf16\n",
              static_cast<long long>(h), static_cast<long long>(kChunk));
  double absorbed_64k_ms = -1;
  for (const int64_t len : {int64_t{8192}, int64_t{65536}, int64_t{1} << 20}) {
    const double pairs = Pairs(kChunk, len) * static_cast<double>(h);
    {
      const Tensor q = kernels::gpu_bench::RandomOnGpu({kChunk, h, dqk}, DType::kBF16, 1);
      const Tensor k = kernels::gpu_bench::RandomOnGpu({len, h, dqk}, DType::kBF16, 2);
      const Tensor v = kernels::gpu_bench::RandomOnGpu({len, h, dv}, DType::kBF16, 3);
      ORRERY_ASSIGN_OR_RETURN(Tensor cu_q,
                              Tensor::FromVector<int64_t>({2}, {0, kChunk}).To(Device::Cuda(0)));
      ORRERY_ASSIGN_OR_RETURN(Tensor cu_k,
                              Tensor::FromVector<int64_t>({2}, {0, len}).To(Device::Cuda(0)));
      Tensor o, lse;
      const double ms = kernels::gpu_bench::TimeMs(
          [&] { return kernels::PrefixCausalAttention(q, k, v, cu_q, cu_k, scale, &o, &lse); }, 1,
          5);
      if (ms < 0) return InternalError("PrefixCausalAttention failed");
      const double flops = 2.0 * static_cast<double>(dqk + dv);
      std::printf(
          "  prefix-causal (MHA form) keys %8lld: %9.3f ms  %6.1f TFLOP/s  (%g FLOPs/pair)\n",
          static_cast<long long>(len), ms, pairs * flops / ms / 1e9, flops);
    }
    const double flops = 2.0 * static_cast<double>(w + dc);
    if (len > 65536 && absorbed_64k_ms > 0 &&
        absorbed_64k_ms * static_cast<double>(len) / 65536.0 > budget_s * 1e3) {
      std::printf("  absorbed (paged)        keys %8lld: skipped (estimated %.1f s)\n",
                  static_cast<long long>(len), absorbed_64k_ms * len / 65536.0 / 1e3);
      continue;
    }
    constexpr int64_t kPage = 64;
    const int64_t pages = len / kPage;
    kernels::PagedLatentCache cache;
    cache.pages = kernels::gpu_bench::RandomOnGpu({pages, kPage, w}, DType::kBF16, 4);
    std::vector<int32_t> table(static_cast<size_t>(pages));
    for (int64_t p = 0; p < pages; ++p) table[static_cast<size_t>(p)] = static_cast<int32_t>(p);
    ORRERY_ASSIGN_OR_RETURN(cache.block_table,
                            Tensor::FromVector<int32_t>({1, pages}, table).To(Device::Cuda(0)));
    ORRERY_ASSIGN_OR_RETURN(
        cache.context_lens,
        Tensor::FromVector<int32_t>({1}, {static_cast<int32_t>(len)}).To(Device::Cuda(0)));
    const Tensor q = kernels::gpu_bench::RandomOnGpu({1, kChunk, h, w}, DType::kBF16, 5);
    Tensor o, lse;
    const double ms = kernels::gpu_bench::TimeMs(
        [&] { return kernels::MlaDecodePaged(q, cache, dc, static_cast<float>(scale), &o, &lse); },
        1, 5);
    if (ms < 0) return InternalError("MlaDecodePaged failed");
    if (len == 65536) absorbed_64k_ms = ms;
    std::printf("  absorbed (paged)        keys %8lld: %9.3f ms  %6.1f TFLOP/s  (%g FLOPs/pair)\n",
                static_cast<long long>(len), ms, pairs * flops / ms / 1e9, flops);
  }
  ReleaseCachedDeviceMemory(0);
  return Status::OK();
}

StatusOr<std::unique_ptr<model::GpuInferenceState>> MakeState(model::GpuModel* gpu,
                                                              int64_t num_slots, int64_t tokens,
                                                              bool mha) {
  model::GpuInferenceOptions io;
  io.num_slots = num_slots;
  io.max_tokens_per_slot = tokens;
  io.page_size = 64;
  io.prefill_chunk = prefill_chunk;
  io.mha_prefill_min_tokens = mha ? 1024 : 0;
  return model::GpuInferenceState::Create(gpu, io);
}

// 2. One slot prefilled with `len` tokens in one form, then decoded. Returns the prefill seconds.
StatusOr<double> PrefillAndDecode(model::GpuModel* gpu, int64_t len, bool mha,
                                  PhiloxGenerator& gen) {
  const int64_t vocab = gpu->config().vocab_size;
  const std::vector<int32_t> prompt = Random(len, vocab, gen);
  ReleaseCachedDeviceMemory(0);
  const size_t base = GetCachingAllocatorStats(0).bytes_in_use;
  ORRERY_ASSIGN_OR_RETURN(auto state, MakeState(gpu, 1, len + kDecodeWarmup + kDecodeSteps, mha));
  ORRERY_ASSIGN_OR_RETURN(int64_t slot, state->Allocate());
  ResetCachingAllocatorPeak(0);
  const auto t0 = std::chrono::steady_clock::now();
  ORRERY_RETURN_IF_ERROR(state->Prefill({slot}, {prompt}).status());
  const double prefill_s = Seconds(t0);
  const CachingAllocatorStats mem = GetCachingAllocatorStats(0);
  if (state->mha_prefill_tokens() != (mha ? len : 0)) {
    return InternalError("the prefill ran " + std::to_string(state->mha_prefill_tokens()) +
                         " tokens in the MHA form, expected " + std::to_string(mha ? len : 0));
  }
  for (int64_t i = 0; i < kDecodeWarmup; ++i) {
    ORRERY_RETURN_IF_ERROR(state->DecodeStep({slot}, Random(1, vocab, gen)).status());
  }
  const auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kDecodeSteps; ++i) {
    ORRERY_RETURN_IF_ERROR(state->DecodeStep({slot}, Random(1, vocab, gen)).status());
  }
  const double decode_ms = Seconds(t1) * 1e3 / kDecodeSteps;
  std::printf(
      "  %-8s prefill %8lld tokens: %8.2f s  %9.0f tokens/s  peak %6.2f GB (+%6.2f GB over the "
      "model; state %5.2f GB, MHA scratch %5.2f GB)  decode %7.3f ms/token\n",
      mha ? "mha" : "absorbed", static_cast<long long>(len), prefill_s,
      static_cast<double>(len) / prefill_s, Gb(mem.peak_bytes_in_use),
      Gb(mem.peak_bytes_in_use - base), Gb(static_cast<size_t>(state->bytes())),
      mha ? Gb(static_cast<size_t>(len * state->MhaBytesPerToken())) : 0.0, decode_ms);
  return prefill_s;
}

// 3. One Prefill of m tokens onto a copy of a slot holding `context` tokens, per m, in one form.
StatusOr<std::vector<double>> Crossover(model::GpuModel* gpu, int64_t context, bool mha,
                                        const std::vector<int64_t>& sizes, PhiloxGenerator& gen) {
  const int64_t vocab = gpu->config().vocab_size;
  ReleaseCachedDeviceMemory(0);
  ORRERY_ASSIGN_OR_RETURN(auto state, MakeState(gpu, 2, context + sizes.back(), mha));
  ORRERY_ASSIGN_OR_RETURN(int64_t base, state->Allocate());
  ORRERY_ASSIGN_OR_RETURN(int64_t work, state->Allocate());
  if (context > 0)
    ORRERY_RETURN_IF_ERROR(state->Prefill({base}, {Random(context, vocab, gen)}).status());
  std::vector<double> ms;
  for (size_t i = 0; i <= sizes.size(); ++i) {  // a warm-up first
    const int64_t m = sizes[i == 0 ? 0 : i - 1];
    ORRERY_RETURN_IF_ERROR(state->CopySlot(base, work));
    const std::vector<int32_t> feed = Random(m, vocab, gen);
    const auto t0 = std::chrono::steady_clock::now();
    ORRERY_RETURN_IF_ERROR(state->Prefill({work}, {feed}).status());
    if (i > 0) ms.push_back(Seconds(t0) * 1e3);
    ORRERY_RETURN_IF_ERROR(state->Reset(work));
  }
  return ms;
}

StatusOr<Options> Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--config" && has_value) {
      o.config = argv[++i];
    } else if (a == "--lengths" && has_value) {
      o.lengths.clear();
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const long long v = std::atoll(list.substr(at, comma - at).c_str());
        if (v < 1)
          return InvalidArgumentError("--lengths: expected positive integers, got " + list);
        o.lengths.push_back(v);
        at = comma + 1;
      }
    } else if (a == "--chunk" && has_value) {
      prefill_chunk = std::atoll(argv[++i]);
      if (prefill_chunk < 1) return InvalidArgumentError("--chunk: expected a positive integer");
    } else if (a == "--absorbed-budget-s" && has_value) {
      o.absorbed_budget_s = std::atof(argv[++i]);
    } else if (a == "--no-kernels") {
      o.kernels = false;
    } else if (a == "--no-crossover") {
      o.crossover = false;
    } else {
      return InvalidArgumentError(
          "usage: gpu_long_context_bench [--config PATH] [--lengths L1,L2,...] [--chunk N] "
          "[--absorbed-budget-s S] [--no-kernels] [--no-crossover]; got " +
          a);
    }
  }
  return o;
}

int Run(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (CudaDeviceCount() == 0) {
    std::fprintf(stderr, "gpu_long_context_bench: no CUDA device\n");
    return 1;
  }
  StatusOr<Options> opt = Parse(argc, argv);
  if (!opt.ok()) return Fail(opt.status());
  auto config = model::LoadModelConfig(opt->config);
  if (!config.ok()) return Fail(config.status());
  if (opt->kernels) {
    if (Status s = Kernels(*config, opt->absorbed_budget_s); !s.ok()) return Fail(s);
  }
  const auto t_up = std::chrono::steady_clock::now();
  auto host = model::Model::Create(*config, 1, DType::kF32);
  if (!host.ok()) return Fail(host.status());
  model::GpuModelOptions mo;
  mo.compute_dtype = DType::kBF16;
  auto gpu = model::GpuModel::FromHost(**host, mo);
  if (!gpu.ok()) return Fail(gpu.status());
  host->reset();
  std::printf(
      "%s (max_seq_len %lld), bf16, prefill chunks of %lld: the model holds %.2f GB of the device "
      "(%.1f s "
      "to build)\n",
      opt->config.c_str(), static_cast<long long>(config->max_seq_len),
      static_cast<long long>(prefill_chunk), Gb(GetCachingAllocatorStats(0).bytes_in_use),
      Seconds(t_up));
  PhiloxGenerator gen(5, 0);
  double extra_s = -1;  // absorbed minus MHA prefill seconds at the last length both ran
  int64_t both_len = 0;
  for (int64_t len : opt->lengths) {
    len = std::min(len, config->max_seq_len - kDecodeWarmup - kDecodeSteps);
    StatusOr<double> mha_s = PrefillAndDecode(gpu->get(), len, true, gen);
    if (!mha_s.ok()) return Fail(mha_s.status());
    const double estimate =
        extra_s < 0
            ? 0
            : *mha_s + std::max(0.0, extra_s) * std::pow(static_cast<double>(len) / both_len, 2.0);
    if (estimate > opt->absorbed_budget_s) {
      std::printf("  absorbed prefill %8lld tokens: skipped (estimated %.0f s from %lld tokens)\n",
                  static_cast<long long>(len), estimate, static_cast<long long>(both_len));
      continue;
    }
    StatusOr<double> absorbed_s = PrefillAndDecode(gpu->get(), len, false, gen);
    if (!absorbed_s.ok()) return Fail(absorbed_s.status());
    extra_s = *absorbed_s - *mha_s;
    both_len = len;
  }
  if (opt->crossover) {
    const std::vector<int64_t> sizes = {256, 512, 1024, 2048, 4096, 8192};
    int64_t threshold = 0;  // the smallest m from which MHA is at least as fast at every C
    std::vector<bool> mha_wins(sizes.size(), true);
    for (const int64_t context : {int64_t{0}, int64_t{65536}}) {
      auto mha = Crossover(gpu->get(), context, true, sizes, gen);
      if (!mha.ok()) return Fail(mha.status());
      auto absorbed = Crossover(gpu->get(), context, false, sizes, gen);
      if (!absorbed.ok()) return Fail(absorbed.status());
      std::printf("crossover at context %lld (ms per Prefill call, mha / absorbed):",
                  static_cast<long long>(context));
      for (size_t i = 0; i < sizes.size(); ++i) {
        std::printf("  m %lld: %.2f / %.2f", static_cast<long long>(sizes[i]), (*mha)[i],
                    (*absorbed)[i]);
        mha_wins[i] = mha_wins[i] && (*mha)[i] <= (*absorbed)[i];
      }
      std::printf("\n");
    }
    for (size_t i = sizes.size(); i-- > 0 && mha_wins[i];) threshold = sizes[i];
    if (threshold > 0) {
      std::printf("the MHA form is at least as fast from m = %lld tokens at every context\n",
                  static_cast<long long>(threshold));
    } else {
      std::printf("the MHA form is slower at m = %lld at some context\n",
                  static_cast<long long>(sizes.back()));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
