// CPU model benchmarks (configs/model/tiny.toml, f32): forward + cross-entropy + backward tokens/s
// at sequence 256 (8 rows) and 2048 (1 row), and batched decode tokens/s. Figures go to
// docs/benchmarks.md ("Model (CPU)").
//   build-*/tests/model_bench --benchmark_min_time=3
// Threads: ORRERY_NUM_THREADS (Orrery's pool) and OPENBLAS_NUM_THREADS; source scripts/env.sh.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "core/philox.h"
#include "kernels/cross_entropy.h"
#include "model/inference_state.h"
#include "model/model.h"

namespace orrery::model {
namespace {

std::unique_ptr<Model> TinyModel() {
  const char* root = std::getenv("ORRERY_SOURCE_DIR");
  const std::string path =
      std::string(root ? root : ORRERY_SOURCE_DIR_DEFAULT) + "/configs/model/tiny.toml";
  StatusOr<ModelConfig> c = LoadModelConfig(path);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    std::exit(2);
  }
  return std::move(*Model::Create(*c, 1, DType::kF32));
}

Tensor Tokens(int64_t b, int64_t t, int64_t vocab) {
  Tensor tok = Tensor::Empty({b, t}, DType::kI32);
  PhiloxGenerator gen(5, 1);
  for (int64_t i = 0; i < tok.numel(); ++i) tok.data<int32_t>()[i] = gen.UniformInt(vocab);
  return tok;
}

// One training step's model work: forward, masked cross-entropy, backward.
void BM_TinyForwardBackward(benchmark::State& state) {
  const int64_t t = state.range(0), b = state.range(1);
  std::unique_ptr<Model> m = TinyModel();
  Batch batch;
  batch.tokens = Tokens(b, t, m->config().vocab_size);
  Tensor targets = Tokens(1, b * t, m->config().vocab_size);
  targets = *targets.Reshape({b * t});
  auto step = [&] {
    ForwardCache cache;
    StatusOr<Tensor> logits = m->Forward(batch, &cache);
    Tensor dlogits;
    StatusOr<double> loss = kernels::MaskedCrossEntropy(*logits, targets, Tensor(), &dlogits);
    benchmark::DoNotOptimize(*loss);
    return m->Backward(cache, dlogits).ok();
  };
  // One untimed step first: its first touches of fresh heap pages are start-up, not the steady
  // per-step cost a training run sees (this library's benchmark has no warm-up option).
  if (!step()) state.SkipWithError("backward failed");
  for (auto _ : state) {
    if (!step()) state.SkipWithError("backward failed");
  }
  state.SetItemsProcessed(state.iterations() * b * t);
}
BENCHMARK(BM_TinyForwardBackward)
    ->Args({256, 8})
    ->Args({2048, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Forward only (inference over whole sequences, the learner's proximal-policy pass).
void BM_TinyForward(benchmark::State& state) {
  const int64_t t = state.range(0), b = state.range(1);
  std::unique_ptr<Model> m = TinyModel();
  Batch batch;
  batch.tokens = Tokens(b, t, m->config().vocab_size);
  benchmark::DoNotOptimize(m->Forward(batch, nullptr)->raw_data());  // untimed warm-up step
  for (auto _ : state) {
    StatusOr<Tensor> logits = m->Forward(batch, nullptr);
    benchmark::DoNotOptimize(logits->raw_data());
  }
  state.SetItemsProcessed(state.iterations() * b * t);
}
BENCHMARK(BM_TinyForward)
    ->Args({256, 8})
    ->Args({2048, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Batched decode: `slots` sequences each holding a 256-token prompt, one token per step each.
void BM_TinyDecode(benchmark::State& state) {
  const int64_t slots = state.range(0), prompt = 256;
  std::unique_ptr<Model> m = TinyModel();
  InferenceOptions options;
  options.num_slots = slots;
  std::unique_ptr<InferenceState> st = std::move(*InferenceState::Create(*m, options));
  std::vector<int64_t> ids;
  std::vector<std::vector<int32_t>> prompts;
  const Tensor tok = Tokens(slots, prompt, m->config().vocab_size);
  for (int64_t s = 0; s < slots; ++s) {
    ids.push_back(*st->Allocate());
    prompts.emplace_back(tok.data<int32_t>() + s * prompt, tok.data<int32_t>() + (s + 1) * prompt);
  }
  if (!m->Prefill(st.get(), ids, prompts).ok()) state.SkipWithError("prefill failed");
  std::vector<int32_t> next(static_cast<size_t>(slots), 7);
  for (auto _ : state) {
    StatusOr<StepOutput> out = m->DecodeStep(st.get(), ids, next);
    if (!out.ok()) state.SkipWithError("decode failed");
  }
  state.SetItemsProcessed(state.iterations() * slots);
}
BENCHMARK(BM_TinyDecode)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace orrery::model

BENCHMARK_MAIN();
