// Bit-exact resume on the real hybrid model: a small KDA + MLA + LatentMoE model (AttnRes, Quantile
// Balancing) pretrained for every step without a break must give exactly the losses, held-out
// losses and final weights of the same run stopped twice and resumed each time from its checkpoint
// into a freshly built model, with the thread pool running three threads, and the losses of the
// same run on one thread.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <map>

#include "core/config.h"
#include "core/metrics.h"
#include "core/thread_pool.h"
#include "learner/hybrid_trainable.h"
#include "learner/pretrainer.h"
#include "model/model.h"
#include "tests/unit/learner/test_util.h"

namespace orrery {
namespace {

using testing_util::TempDir;

constexpr int kVocab = 256;

// Three layers K K M: a dense first layer, then two LatentMoE layers; big enough that GEMMs,
// RMSNorm, the KDA heads and the MLA segments are split over the pool.
model::ModelConfig SmallHybrid() {
  const std::string text = R"(
[model]
name = "resume-test"
vocab_size = 256
hidden_size = 64
num_layers = 3
full_attn_layers = [3]
first_k_dense = 1
dense_intermediate = 96
[model.kda]
heads = 2
head_k_dim = 16
head_v_dim = 16
conv_size = 4
decay_rank = 16
chunk_size = 16
[model.mla]
heads = 2
q_lora_rank = 32
kv_lora_rank = 32
qk_nope_head_dim = 16
qk_rope_head_dim = 8
v_head_dim = 16
[model.moe]
num_experts = 4
top_k = 2
num_shared_experts = 1
expert_intermediate = 32
shared_intermediate = 32
latent_dim = 32
[model.attn_res]
block_size = 2
)";
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(text, "resume-test.toml");
  EXPECT_TRUE(doc.ok()) << doc.status().ToString();
  ConfigTable root = doc->root();
  StatusOr<model::ModelConfig> c = model::ReadModelConfig(root);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(doc->Finish().ok());
  return *c;
}

PretrainConfig ResumeConfig(const std::string& data_dir) {
  PretrainConfig c;
  c.run.seed = 17;
  c.run.deterministic = true;
  c.data_dir = data_dir;
  c.model = SmallHybrid();
  c.tokens_per_step = 512;
  c.micro_batch_tokens = 256;  // two micro-batches per step: accumulation and a 2-cache QB update
  c.eval_every = 3;
  c.eval_tokens = 256;
  c.checkpoint_every = 0;  // only stops and the end write checkpoints
  c.keep_checkpoints = 2;
  c.adamw.weight_decay = 0.1;
  c.schedule.peak_lr = 3e-3;
  c.schedule.warmup_steps = 2;
  c.stages = {{"ctx32", 32, 512 * 4, 1.0}, {"ctx128", 128, 512 * 4, 0.5}};
  c.schedule.total_steps = c.total_steps();
  return c;
}

// One invocation of the trainer on a freshly created model (nothing survives between calls but
// the run directory), as `orrery pretrain [--resume] --max-steps N` would do.
StatusOr<PretrainSummary> RunHybrid(const PretrainConfig& c, const TokenDataset& data,
                                    const std::string& run_dir, int64_t max_steps, bool resume) {
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model,
                          model::Model::Create(c.model, c.run.seed));
  HybridTrainable trainable(model.get());
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
std::map<int64_t, std::pair<double, double>> StepLosses(const std::string& run_dir) {
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

TEST(HybridResumeTest, ResumedHybridRunMatchesAnUninterruptedOneBitForBit) {
  // The pool of this process runs the caller plus at least two workers, whatever the machine.
  ::unsetenv("ORRERY_NUM_THREADS");  // this test needs a pool of its own size
  ThreadPool::SetDefaultThreads(3);
  ASSERT_GE(ThreadPool::Default().num_threads() + 1, 2);
  TempDir dir;
  testing_util::WriteRandomCorpus(dir.path() + "/data", kVocab);
  StatusOr<TokenDataset> data = TokenDataset::Open(dir.path() + "/data");
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  const PretrainConfig c = ResumeConfig(dir.path() + "/data");
  ASSERT_EQ(c.total_steps(), 8);

  StatusOr<PretrainSummary> a = RunHybrid(c, *data, dir.path() + "/a", -1, false);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->finished);
  // Stop in the middle of the first stage, exactly at its end, in the middle of the second, then
  // finish: every stop resumes into a freshly created model.
  ASSERT_TRUE(RunHybrid(c, *data, dir.path() + "/b", 3, false).ok());
  for (int64_t stop : {4, 6}) {
    StatusOr<PretrainSummary> part = RunHybrid(c, *data, dir.path() + "/b", stop, true);
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    EXPECT_FALSE(part->finished);
    EXPECT_EQ(part->steps, stop);
  }
  StatusOr<PretrainSummary> end = RunHybrid(c, *data, dir.path() + "/b", -1, true);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_TRUE(end->finished);

  auto la = StepLosses(dir.path() + "/a"), lb = StepLosses(dir.path() + "/b");
  ASSERT_EQ(la.size(), 8u);
  ASSERT_EQ(lb.size(), 8u);
  for (const auto& [step, loss] : la) {
    EXPECT_EQ(loss.first, lb[step].first) << "loss at step " << step;  // exact, not approximate
    EXPECT_EQ(loss.second, lb[step].second) << "held-out loss at step " << step;
  }
  // Each stage starts (held-out loss at its length, a stage_start record) once, even when a stop
  // falls on the stage boundary.
  StatusOr<std::vector<MetricRecord>> records = ReadMetricsFile(dir.path() + "/b/metrics.jsonl");
  ASSERT_TRUE(records.ok());
  int stage_starts = 0;
  for (const MetricRecord& r : *records) stage_starts += r.scalars.count("stage_start");
  EXPECT_EQ(stage_starts, 2);
  // The model learns something (so equal losses are not equal by being constant).
  EXPECT_LT(la.rbegin()->second.first, la.begin()->second.first);

  // The same run on a pool of one thread: CPU results do not depend on the thread count either.
  ThreadPool::SetDefaultThreads(1);
  ASSERT_TRUE(RunHybrid(c, *data, dir.path() + "/one", -1, false).ok());
  auto l1 = StepLosses(dir.path() + "/one");
  ASSERT_EQ(l1.size(), 8u);
  for (const auto& [step, loss] : la) {
    EXPECT_EQ(loss.first, l1[step].first) << "loss at step " << step << " on one thread";
    EXPECT_EQ(loss.second, l1[step].second) << "held-out loss at step " << step << " on one thread";
  }
  ThreadPool::SetDefaultThreads(0);
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
      ASSERT_EQ(t.nbytes(), it->second.nbytes()) << what << " " << name;
      EXPECT_EQ(0, std::memcmp(t.raw_data(), it->second.raw_data(), t.nbytes()))
          << what << " " << name << " differs";
    }
  };
  same(ca->model, cb->model, "model");
  same(ca->optimizer, cb->optimizer, "optimizer");
  EXPECT_EQ(ca->model.count("layers.1.moe.balancing_bias"), 1u);
}

}  // namespace
}  // namespace orrery
