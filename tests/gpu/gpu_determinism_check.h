// Whole-step determinism of the GPU model's trainer (issue 22: "a resumed run continues exactly"),
// shared by the GPU test on CUDA (tests/gpu/gpu_determinism_test.cc, at sizes where the step's
// reductions run over hundreds of blocks) and the unit test of the same orchestration on the ops'
// CPU twins (tests/unit/learner/gpu_model_cpu_test.cc, small):
//   - CheckSameSteps: two GPU models made from the same host weights take the same optimizer steps
//     bit for bit (loss sums, gradient norms, every gradient, the weights after AdamW);
//   - CheckResume: GPU-model pretraining stopped part-way and resumed from its checkpoints into
//     freshly built models reproduces the losses, held-out losses, weights and optimizer moments
//     of the uninterrupted run bit for bit (the CPU trainer's HybridResumeTest, on the GPU model).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/device.h"
#include "core/metrics.h"
#include "core/philox.h"
#include "learner/adamw.h"
#include "learner/gpu_trainable.h"
#include "learner/pretrainer.h"
#include "model/config.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"
#include "tests/unit/learner/test_util.h"

namespace orrery::determinism_check {

// Every layer kind: KDA with head size 64 (the tensor-core kernels in bf16), MLA, dense and
// LatentMoE MLPs, AttnRes blocks of two layers.
inline model::ModelConfig StepConfig(int64_t vocab, int64_t hidden) {
  const std::string text =
      "[model]\nname = \"determinism\"\nvocab_size = " + std::to_string(vocab) +
      "\nhidden_size = " + std::to_string(hidden) +
      R"(
num_layers = 4
full_attn_layers = [3]
first_k_dense = 1
dense_intermediate = 384
[model.kda]
heads = 2
head_k_dim = 64
head_v_dim = 64
decay_rank = 16
chunk_size = 64
[model.mla]
heads = 2
q_lora_rank = 64
kv_lora_rank = 64
qk_nope_head_dim = 32
qk_rope_head_dim = 16
v_head_dim = 32
[model.moe]
num_experts = 8
top_k = 2
num_shared_experts = 1
expert_intermediate = 64
shared_intermediate = 64
latent_dim = 64
[model.attn_res]
block_size = 2
)";
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(text, "determinism.toml");
  EXPECT_TRUE(doc.ok()) << doc.status().ToString();
  ConfigTable root = doc->root();
  StatusOr<model::ModelConfig> c = model::ReadModelConfig(root);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(doc->Finish().ok());
  return *c;
}

inline bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct StepSizes {
  int64_t vocab, hidden;
  std::vector<int64_t> cu_seqlens;  // one row of documents: 0 .. tokens
  int steps;
};

// Everything the steps leave that the next one reads, on the host.
struct StepRecord {
  std::vector<double> losses, norms;
  std::vector<Tensor> grads, masters;  // the last step's gradients; the weights after it
};

// `sizes.steps` optimizer steps of a fresh GPU model made from `host` on one batch, a third of
// whose tokens are one frequent token (many rows into one embedding row).
inline void RunSteps(model::Model& host, Device device, DType dtype, const StepSizes& sizes,
                     StepRecord* out) {
  model::GpuModelOptions o;
  o.device = device;
  o.compute_dtype = dtype;
  auto gpu = model::GpuModel::FromHost(host, o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  GpuTrainable trainable(gpu->get());
  auto adamw = AdamW::Create(AdamWOptions{}, trainable.Parameters());
  ASSERT_TRUE(adamw.ok()) << adamw.status().ToString();
  PackedBatch batch;
  batch.rows = 1;
  batch.seq_len = sizes.cu_seqlens.back();
  batch.cu_seqlens.assign(sizes.cu_seqlens.begin(), sizes.cu_seqlens.end());
  PhiloxGenerator rng(77, 0);
  const uint64_t vocab = static_cast<uint64_t>(sizes.vocab);
  for (int64_t i = 0; i < batch.seq_len; ++i) {
    batch.inputs.push_back(rng.UniformInt(3) == 0 ? 5
                                                  : static_cast<int32_t>(rng.UniformInt(vocab)));
    batch.targets.push_back(i % 9 == 4 ? -1 : static_cast<int32_t>(rng.UniformInt(vocab)));
    batch.num_targets += batch.targets.back() >= 0;
  }
  for (int step = 0; step < sizes.steps; ++step) {
    ASSERT_TRUE(adamw->ZeroGrad().ok());
    auto loss = trainable.ForwardBackward(batch, 1.0 / batch.num_targets);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    ASSERT_TRUE(trainable.UpdateBalancing().ok());
    auto norm = adamw->ClipGradNorm(1.0);
    ASSERT_TRUE(norm.ok()) << norm.status().ToString();
    out->losses.push_back(loss->loss_sum);
    out->norms.push_back(*norm);
    if (step == sizes.steps - 1) {
      for (const model::GpuParameter& p : (*gpu)->parameters()) {
        out->grads.push_back(p.grad.To(Device::Cpu()).value());
      }
    }
    ASSERT_TRUE(adamw->Step(1e-3).ok());
  }
  for (const model::GpuParameter& p : (*gpu)->parameters()) {
    out->masters.push_back(p.master.To(Device::Cpu()).value());
  }
}

// `before_second` (when given) runs between the two models' steps: what it changes must change
// no bit of them.
inline void CheckSameSteps(Device device, DType dtype, const StepSizes& sizes,
                           const std::function<void()>& before_second = {}) {
  const model::ModelConfig config = StepConfig(sizes.vocab, sizes.hidden);
  auto host = model::Model::Create(config, 41, DType::kF32);
  ASSERT_TRUE(host.ok());
  StepRecord a, b;
  RunSteps(**host, device, dtype, sizes, &a);
  if (::testing::Test::HasFatalFailure()) return;
  if (before_second) before_second();
  RunSteps(**host, device, dtype, sizes, &b);
  if (::testing::Test::HasFatalFailure()) return;
  for (size_t s = 0; s < a.losses.size(); ++s) {
    std::printf("%s step %zu: loss sum %.17g, grad norm %.17g\n",
                std::string(DTypeName(dtype)).c_str(), s, a.losses[s], a.norms[s]);
    EXPECT_EQ(std::memcmp(&a.losses[s], &b.losses[s], sizeof(double)), 0)
        << "loss at step " << s << ": " << a.losses[s] << " vs " << b.losses[s];
    EXPECT_EQ(std::memcmp(&a.norms[s], &b.norms[s], sizeof(double)), 0)
        << "grad norm at step " << s << ": " << a.norms[s] << " vs " << b.norms[s];
  }
  ASSERT_EQ(a.grads.size(), b.grads.size());
  const std::vector<model::Parameter>& names = (*host)->parameters();
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(SameBytes(a.grads[i], b.grads[i])) << "gradient of " << names[i].name;
    EXPECT_TRUE(SameBytes(a.masters[i], b.masters[i])) << "weights of " << names[i].name;
  }
  // The steps did something: the loss fell (so equal losses are not equal by being constant).
  EXPECT_LT(a.losses.back(), a.losses.front());
}

// ---- pretraining resumed from its checkpoints ----

struct ResumeSizes {
  int64_t vocab, hidden;
  int64_t tokens_per_step, micro_batch_tokens;  // two micro-batches: accumulation, 2-cache QB
  int64_t seq_len_1, seq_len_2;                 // the two stages' row lengths
  int docs;
  int64_t max_doc_extra;  // documents of 10 .. 10 + max_doc_extra - 1 tokens
};

// Two stages of four steps each, held-out evaluation every third step, checkpoints only at stops
// and the end.
inline PretrainConfig ResumeConfig(const std::string& data_dir, Device device, DType dtype,
                                   const ResumeSizes& sizes) {
  PretrainConfig c;
  c.run.seed = 17;
  c.run.deterministic = true;
  c.run.device = device.is_cuda() ? RunDevice::kCuda : RunDevice::kCpu;
  c.run.dtype = dtype;
  c.data_dir = data_dir;
  c.model = StepConfig(sizes.vocab, sizes.hidden);
  c.tokens_per_step = sizes.tokens_per_step;
  c.micro_batch_tokens = sizes.micro_batch_tokens;
  c.eval_every = 3;
  c.eval_tokens = sizes.micro_batch_tokens;
  c.checkpoint_every = 0;
  c.keep_checkpoints = 2;
  c.adamw.weight_decay = 0.1;
  c.schedule.peak_lr = 3e-3;
  c.schedule.warmup_steps = 2;
  c.stages = {{"stage1", sizes.seq_len_1, sizes.tokens_per_step * 4, 1.0},
              {"stage2", sizes.seq_len_2, sizes.tokens_per_step * 4, 0.5}};
  c.schedule.total_steps = c.total_steps();
  return c;
}

// One invocation of the trainer on a freshly built GPU model (nothing survives between calls but
// the run directory and the process's device context), as `orrery pretrain [--resume]
// --max-steps N` with [run] device = "cuda" does.
inline StatusOr<PretrainSummary> RunTrainer(const PretrainConfig& c, Device device,
                                            const TokenDataset& data, const std::string& run_dir,
                                            int64_t max_steps, bool resume) {
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> host,
                          model::Model::Create(c.model, c.run.seed));
  model::GpuModelOptions go;
  go.device = device;
  go.compute_dtype = c.run.dtype;
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<model::GpuModel> gpu,
                          model::GpuModel::FromHost(*host, go));
  GpuTrainable trainable(gpu.get());
  PretrainerOptions o;
  o.config = c;
  o.run_dir = run_dir;
  o.max_steps = max_steps;
  o.resume = resume;
  o.show_progress = false;
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<Pretrainer> p, Pretrainer::Create(o, &trainable, &data));
  return p->Run();
}

// step -> (loss, eval_loss or -1) of every training step in metrics.jsonl.
inline std::map<int64_t, std::pair<double, double>> StepLosses(const std::string& run_dir) {
  std::map<int64_t, std::pair<double, double>> out;
  StatusOr<std::vector<MetricRecord>> records = ReadMetricsFile(run_dir + "/metrics.jsonl");
  EXPECT_TRUE(records.ok()) << records.status().ToString();
  if (!records.ok()) return out;
  for (const MetricRecord& r : *records) {
    if (!r.scalars.count("loss")) continue;
    out[r.step] = {r.scalars.at("loss"),
                   r.scalars.count("eval_loss") ? r.scalars.at("eval_loss") : -1};
  }
  return out;
}

inline void CheckResume(Device device, DType dtype, const ResumeSizes& sizes) {
  testing_util::TempDir dir;
  testing_util::WriteRandomCorpus(dir.path() + "/data", static_cast<int>(sizes.vocab), sizes.docs,
                                  sizes.max_doc_extra);
  StatusOr<TokenDataset> data = TokenDataset::Open(dir.path() + "/data");
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  const PretrainConfig c = ResumeConfig(dir.path() + "/data", device, dtype, sizes);
  ASSERT_EQ(c.total_steps(), 8);

  StatusOr<PretrainSummary> a = RunTrainer(c, device, *data, dir.path() + "/a", -1, false);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->finished);
  // Stop in the middle of the first stage, exactly at its end, in the middle of the second, then
  // finish: every stop resumes into a freshly built model.
  ASSERT_TRUE(RunTrainer(c, device, *data, dir.path() + "/b", 3, false).ok());
  for (int64_t stop : {4, 6}) {
    StatusOr<PretrainSummary> part = RunTrainer(c, device, *data, dir.path() + "/b", stop, true);
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    EXPECT_FALSE(part->finished);
    EXPECT_EQ(part->steps, stop);
  }
  StatusOr<PretrainSummary> end = RunTrainer(c, device, *data, dir.path() + "/b", -1, true);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_TRUE(end->finished);

  auto la = StepLosses(dir.path() + "/a"), lb = StepLosses(dir.path() + "/b");
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 8u);
  for (const auto& [step, loss] : la) {
    std::printf("step %lld: loss %.17g, held-out %.17g\n", static_cast<long long>(step), loss.first,
                loss.second);
    EXPECT_EQ(loss.first, lb[step].first) << "loss at step " << step;  // exact, not approximate
    EXPECT_EQ(loss.second, lb[step].second) << "held-out loss at step " << step;
  }
  EXPECT_LT(la.rbegin()->second.first, la.begin()->second.first);  // it learns something
  // Final weights, balancing biases and optimizer moments: equal byte for byte.
  StatusOr<LoadedCheckpoint> ca = ReadCheckpoint(dir.path() + "/a");
  StatusOr<LoadedCheckpoint> cb = ReadCheckpoint(dir.path() + "/b");
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  ASSERT_TRUE(cb.ok()) << cb.status().ToString();
  EXPECT_EQ(ca->state.step, 8);
  EXPECT_EQ(cb->state.step, 8);
  auto same = [](const std::map<std::string, Tensor>& x, const std::map<std::string, Tensor>& y,
                 const std::string& what) {
    ASSERT_EQ(x.size(), y.size()) << what;
    for (const auto& [name, t] : x) {
      auto it = y.find(name);
      ASSERT_NE(it, y.end()) << what << " " << name;
      EXPECT_TRUE(SameBytes(t, it->second)) << what << " " << name << " differs";
    }
  };
  same(ca->model, cb->model, "model");
  same(ca->optimizer, cb->optimizer, "optimizer");
  EXPECT_EQ(ca->model.count("layers.1.moe.balancing_bias"), 1u);
}

}  // namespace orrery::determinism_check
