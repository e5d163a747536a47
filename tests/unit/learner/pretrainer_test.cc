#include "learner/pretrainer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>

#include "core/metrics.h"
#include "learner/cross_entropy.h"
#include "tests/unit/learner/test_util.h"

namespace orrery {
namespace {

using testing_util::TempDir;
using testing_util::WriteCorpus;

constexpr int kVocab = 24;

// A bigram language model: logits_i = E[token_i] + b, plus a non-trained buffer added to the
// logit of token 0 and moved by UpdateBalancing, so checkpoints must carry buffers for resumed
// runs to match. A test fixture for the trainer, not a model anyone trains.
class BigramModel : public TrainableModel {
 public:
  BigramModel() {
    std::vector<float> e(kVocab * kVocab);
    for (size_t i = 0; i < e.size(); ++i) e[i] = 0.01f * static_cast<float>((i * 37) % 11) - 0.05f;
    params_ = {{"embed", Tensor::FromVector<float>({kVocab, kVocab}, e),
                Tensor::Zeros({kVocab, kVocab}, DType::kF32), true},
               {"bias", Tensor::Zeros({kVocab}, DType::kF32), Tensor::Zeros({kVocab}, DType::kF32),
                false}};
    buffer_ = Tensor::Zeros({1}, DType::kF32);
  }
  std::vector<ParamRef> Parameters() override { return params_; }
  std::vector<std::pair<std::string, Tensor>> Buffers() override { return {{"balance", buffer_}}; }
  int64_t max_seq_len() const override { return 128; }

  StatusOr<LossSum> ForwardBackward(const PackedBatch& batch, double grad_scale) override {
    Tensor logits = Logits(batch);
    Tensor dlogits;
    ORRERY_ASSIGN_OR_RETURN(LossSum l, CrossEntropy(logits, batch.targets, grad_scale, &dlogits));
    float* de = params_[0].grad.data<float>();
    float* db = params_[1].grad.data<float>();
    for (size_t i = 0; i < batch.inputs.size(); ++i) {
      for (int v = 0; v < kVocab; ++v) {
        de[batch.inputs[i] * kVocab + v] += dlogits.data<float>()[i * kVocab + v];
        db[v] += dlogits.data<float>()[i * kVocab + v];
      }
      seen_zero_ += batch.targets[i] == 0 ? 1 : 0;
      seen_ += batch.targets[i] >= 0 ? 1 : 0;
    }
    return l;
  }
  StatusOr<LossSum> Evaluate(const PackedBatch& batch) override {
    return CrossEntropy(Logits(batch), batch.targets, 0, nullptr);
  }
  StatusOr<std::vector<ExpertLoadReport>> UpdateBalancing() override {
    buffer_.data<float>()[0] = 0.5f * buffer_.data<float>()[0] +
                               static_cast<float>(seen_zero_) / static_cast<float>(seen_ + 1);
    seen_ = seen_zero_ = 0;
    return std::vector<ExpertLoadReport>{{{0.5, 1.5}, 0.5}};
  }

 private:
  Tensor Logits(const PackedBatch& batch) const {
    const int64_t n = static_cast<int64_t>(batch.inputs.size());
    Tensor logits = Tensor::Empty({n, kVocab}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) {
      for (int v = 0; v < kVocab; ++v) {
        logits.data<float>()[i * kVocab + v] =
            params_[0].value.data<float>()[batch.inputs[i] * kVocab + v] +
            params_[1].value.data<float>()[v] + (v == 0 ? buffer_.data<float>()[0] : 0.0f);
      }
    }
    return logits;
  }
  std::vector<ParamRef> params_;
  Tensor buffer_;
  int64_t seen_ = 0, seen_zero_ = 0;
};

PretrainConfig TestConfig(const std::string& data_dir) {
  PretrainConfig c;
  c.run.seed = 5;
  c.data_dir = data_dir;
  c.model.vocab_size = kVocab;
  c.tokens_per_step = 64;
  c.micro_batch_tokens = 32;
  c.eval_every = 4;
  c.eval_tokens = 64;
  c.checkpoint_every = 3;
  c.keep_checkpoints = 2;
  c.schedule.peak_lr = 0.05;
  c.schedule.warmup_steps = 2;
  c.stages = {{"short", 8, 64 * 6, 1.0}, {"long", 32, 64 * 6, 0.5}};
  c.schedule.total_steps = c.total_steps();
  return c;
}

StatusOr<PretrainSummary> RunTrainer(const PretrainConfig& c, const TokenDataset& data,
                                     const std::string& run_dir, int64_t max_steps, bool resume,
                                     std::function<void(const MetricRecord&)> on_metric = nullptr) {
  BigramModel model;
  PretrainerOptions o;
  o.config = c;
  o.run_dir = run_dir;
  o.max_steps = max_steps;
  o.resume = resume;
  o.show_progress = false;
  o.on_metric = std::move(on_metric);
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<Pretrainer> p, Pretrainer::Create(o, &model, &data));
  return p->Run();
}

std::map<int64_t, std::pair<double, double>> Losses(const std::string& run_dir) {
  std::map<int64_t, std::pair<double, double>> out;  // step -> (loss, eval_loss or -1)
  std::vector<MetricRecord> records = *ReadMetricsFile(run_dir + "/metrics.jsonl");
  for (const MetricRecord& r : records) {
    if (!r.scalars.count("loss")) continue;
    out[r.step] = {r.scalars.at("loss"),
                   r.scalars.count("eval_loss") ? r.scalars.at("eval_loss") : -1};
  }
  return out;
}

class PretrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<int64_t> lengths;
    for (int d = 0; d < 40; ++d) lengths.push_back(5 + (d * 13) % 29);
    WriteCorpus(dir_.path() + "/data", lengths, kVocab, 5);
    data_.emplace(*TokenDataset::Open(dir_.path() + "/data"));
  }
  TempDir dir_;
  std::optional<TokenDataset> data_;
};

TEST_F(PretrainerTest, RunsEveryStageAndLearns) {
  PretrainConfig c = TestConfig(dir_.path() + "/data");
  std::vector<MetricRecord> live;  // what on_metric saw (the launcher's dashboard feed)
  StatusOr<PretrainSummary> s = RunTrainer(c, *data_, dir_.path() + "/run", -1, false,
                                           [&live](const MetricRecord& m) { live.push_back(m); });
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->finished);
  EXPECT_EQ(s->steps, 12);
  ASSERT_EQ(s->stages.size(), 2u);
  EXPECT_EQ(s->stages[1].seq_len, 32);
  for (const StageSummary& st : s->stages) {
    EXPECT_LT(st.last_eval_loss, st.first_eval_loss) << st.name;
  }
  std::vector<MetricRecord> records = *ReadMetricsFile(dir_.path() + "/run/metrics.jsonl");
  int transitions = 0;
  for (const MetricRecord& r : records) transitions += r.scalars.count("stage_start");
  EXPECT_EQ(transitions, 2);
  EXPECT_TRUE(records.back().vectors.count("expert_load/layer0"));
  ASSERT_EQ(live.size(), records.size());  // every record, in the file's order
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(live[i].step, records[i].step) << i;
    EXPECT_EQ(live[i].scalars.size(), records[i].scalars.size()) << i;
  }
  // Checkpoints every 3 steps, keeping 2: steps 9 and 12 remain.
  EXPECT_EQ(*LatestCheckpoint(dir_.path() + "/run/checkpoints"),
            dir_.path() + "/run/checkpoints/step-00000012");
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/run/checkpoints/step-00000006"));
}

TEST_F(PretrainerTest, ResumedRunMatchesAnUninterruptedOneBitForBit) {
  PretrainConfig c = TestConfig(dir_.path() + "/data");
  c.checkpoint_every = 0;  // only the stop at --max-steps and the end write checkpoints
  ASSERT_TRUE(RunTrainer(c, *data_, dir_.path() + "/a", -1, false).ok());
  // Stop in the middle of the first stage, then again just after the stage transition.
  ASSERT_TRUE(RunTrainer(c, *data_, dir_.path() + "/b", 5, false).ok());
  StatusOr<PretrainSummary> mid = RunTrainer(c, *data_, dir_.path() + "/b", 7, true);
  ASSERT_TRUE(mid.ok()) << mid.status().ToString();
  EXPECT_FALSE(mid->finished);
  StatusOr<PretrainSummary> end = RunTrainer(c, *data_, dir_.path() + "/b", -1, true);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_TRUE(end->finished);
  auto a = Losses(dir_.path() + "/a"), b = Losses(dir_.path() + "/b");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (const auto& [step, loss] : a) {
    EXPECT_EQ(loss.first, b[step].first) << "step " << step;  // exact, not approximate
    EXPECT_EQ(loss.second, b[step].second) << "step " << step;
  }
}

TEST_F(PretrainerTest, RefusesBadSetups) {
  PretrainConfig c = TestConfig(dir_.path() + "/data");
  ASSERT_TRUE(RunTrainer(c, *data_, dir_.path() + "/r", 2, false).ok());
  Status again = RunTrainer(c, *data_, dir_.path() + "/r", -1, false).status();
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("--resume"), std::string::npos);
  EXPECT_EQ(RunTrainer(c, *data_, dir_.path() + "/empty", -1, true).status().code(),
            StatusCode::kNotFound);
  c.stages[1].seq_len = 256;  // the bigram fixture allows 128
  Status longer = RunTrainer(c, *data_, dir_.path() + "/long", -1, false).status();
  EXPECT_NE(longer.message().find("longer than the model allows"), std::string::npos);
  c = TestConfig(dir_.path() + "/data");
  c.model.vocab_size = 10;
  EXPECT_FALSE(RunTrainer(c, *data_, dir_.path() + "/v", -1, false).ok());
}

TEST(PretrainConfigTest, BadConfigsFailWithOneLine) {
  // CTest sets ORRERY_SOURCE_DIR; run by hand, the source tree is found from this file's path.
  const char* env = std::getenv("ORRERY_SOURCE_DIR");
  const std::string file = __FILE__;
  const std::string src = env ? env : file.substr(0, file.rfind("/tests/unit/learner/"));
  TempDir dir;
  const std::string model = src + "/configs/model/tiny.toml";
  auto load = [&](const std::string& extra_pretrain, const std::string& stages) {
    std::ofstream(dir.path() + "/p.toml")
        << "[pretrain]\nmodel = \"" << model << "\"\ndata = \"data\"\n"
        << (extra_pretrain.find("tokens_per_step") == std::string::npos
                ? "tokens_per_step = 1024\nmicro_batch_tokens = 512\n"
                : "")
        << extra_pretrain << "\n[optimizer]\nlr = 0.001\n"
        << stages;
    return LoadPretrainConfig(dir.path() + "/p.toml");
  };
  const std::string good = "[[stages]]\nseq_len = 256\ntokens = 4096\n";
  StatusOr<PretrainConfig> ok = load("", good);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->data_dir, dir.path() + "/data");  // relative to the config file
  EXPECT_EQ(ok->total_steps(), 4);
  auto message = [&](const std::string& extra, const std::string& stages) {
    Status s = load(extra, stages).status();
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    return s.message();
  };
  EXPECT_NE(message("tokens_per_stp = 3", good).find("tokens_per_stp"), std::string::npos);
  EXPECT_NE(message("", "[[stages]]\nseq_len = 256\ntokens = 0\n").find("stages"),
            std::string::npos);
  EXPECT_NE(message("", "[[stages]]\nseq_len = 300\ntokens = 4096\n").find("does not divide"),
            std::string::npos);
  EXPECT_NE(message("", "").find("stages"), std::string::npos);
  // tiny.toml declares max_seq_len = 4096: a stage of 8192 names the file, the stage and both.
  const std::string longer =
      message("tokens_per_step = 8192\nmicro_batch_tokens = 8192\n",
              "[[stages]]\nname = \"ctx8k\"\nseq_len = 8192\ntokens = 8192\n");
  for (const std::string& part :
       {std::string("p.toml"), std::string("stages"), std::string("seq_len"),
        std::string("'ctx8k'"), std::string("8192"), std::string("max_seq_len 4096"), model}) {
    EXPECT_NE(longer.find(part), std::string::npos) << part << " not in: " << longer;
  }
}

}  // namespace
}  // namespace orrery
