// The RL trainer end to end on the tiny model: it learns a bandit (the probability of rewarded
// tokens rises), drops stale samples and skips groups without signal, two Gloo ranks as two
// processes make the same update as one rank on the union of their data, and checkpoints restore
// the exact state.
#include "learner/rl/rl_trainer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/philox.h"
#include "core/safetensors.h"
#include "learner/comm/gloo_communicator.h"
#include "model/config.h"

namespace orrery::rl {
namespace {

std::string SourceDir() {
  const char* d = std::getenv("ORRERY_SOURCE_DIR");
  return d != nullptr ? d : ".";
}

std::unique_ptr<model::Model> TinyModel(uint64_t seed) {
  auto config = model::LoadModelConfig(SourceDir() + "/configs/model/tiny.toml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  auto m = model::Model::Create(*config, seed);
  EXPECT_TRUE(m.ok());
  return std::move(*m);
}

const std::vector<int32_t> kPrompt = {17, 300, 5, 41, 99, 12};

// Probability mass the model puts on "rewarded" tokens (even ids) after the prompt.
double RewardedMass(model::Model& m) {
  model::Batch b;
  b.tokens = Tensor::FromVector<int32_t>({1, static_cast<int64_t>(kPrompt.size())}, kPrompt);
  auto logits = m.Forward(b, nullptr);
  EXPECT_TRUE(logits.ok());
  const int64_t v = m.config().vocab_size;
  const float* z = logits->data<float>() + (kPrompt.size() - 1) * v;
  double mx = z[0], sum = 0, even = 0;
  for (int64_t j = 1; j < v; ++j) mx = std::max(mx, double(z[j]));
  for (int64_t j = 0; j < v; ++j) {
    const double p = std::exp(z[j] - mx);
    sum += p;
    if (j % 2 == 0) even += p;
  }
  return even / sum;
}

// `groups` groups of `g` one-token answers sampled from the model at `version`, rewarded 1 for
// an even id; the routing of the prompt is recorded as a rollout would (R3).
std::vector<PolicyGroup> SampleGroups(model::Model& m, int groups, int g, int64_t version,
                                      uint64_t seed) {
  model::Batch b;
  b.tokens = Tensor::FromVector<int32_t>({1, static_cast<int64_t>(kPrompt.size())}, kPrompt);
  model::ForwardCache cache;
  auto logits = m.Forward(b, &cache);
  EXPECT_TRUE(logits.ok());
  Tensor ids = cache.StackedExpertIds();
  const int64_t v = m.config().vocab_size;
  const size_t n = kPrompt.size();
  const size_t layers = m.config().num_moe_layers(), k = m.config().moe.top_k;
  const float* z = logits->data<float>() + (n - 1) * v;
  double mx = z[0], sum = 0;
  for (int64_t j = 1; j < v; ++j) mx = std::max(mx, double(z[j]));
  for (int64_t j = 0; j < v; ++j) sum += std::exp(z[j] - mx);
  PhiloxGenerator rng(seed, version);
  std::vector<PolicyGroup> out(groups);
  for (int gi = 0; gi < groups; ++gi) {
    out[gi].group_id = gi;
    for (int i = 0; i < g; ++i) {
      double u = rng.Uniform() * sum, acc = 0;
      int32_t tok = static_cast<int32_t>(v - 1);
      for (int64_t j = 0; j < v; ++j) {
        acc += std::exp(z[j] - mx);
        if (acc >= u) {
          tok = static_cast<int32_t>(j);
          break;
        }
      }
      PolicySample s;
      s.tokens = kPrompt;
      s.tokens.push_back(tok);
      s.behaviour_logprobs.assign(n, 0.0f);
      s.behaviour_logprobs.push_back(static_cast<float>(z[tok] - mx - std::log(sum)));
      s.policy_versions.assign(n + 1, version);
      for (size_t p = 0; p <= n; ++p) s.loss_mask.push_back(p == n ? 1 : 0);
      s.routed_experts.assign((n + 1) * layers * k, 0);
      for (size_t p = 0; p <= n; ++p) {
        for (size_t l = 0; l < layers; ++l) {
          for (size_t j = 0; j < k; ++j) {
            s.routed_experts[(p * layers + l) * k + j] =
                static_cast<uint16_t>(p < n ? ids.data<int32_t>()[(l * n + p) * k + j] : j);
          }
        }
      }
      s.reward = tok % 2 == 0 ? 1.0 : 0.0;
      out[gi].samples.push_back(std::move(s));
    }
  }
  return out;
}

RlTrainerOptions Options() {
  RlTrainerOptions o;
  o.lr = 3e-3;
  o.adamw.weight_decay = 0;
  return o;
}

TEST(RlTrainer, LearnsABandit) {
  auto m = TinyModel(1);
  auto comm = comm::MakeLocalCommunicator();
  auto trainer = RlTrainer::Create(m.get(), comm.get(), Options());
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  const double before = RewardedMass(*m);
  int updates = 0;
  double grad_norm = 0;
  for (int step = 0; step < 8; ++step) {
    auto groups = SampleGroups(*m, 4, 8, (*trainer)->version(), 7);
    auto s = (*trainer)->Step(groups);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    if (!s->updated) continue;  // every group all-rewarded (or all not): no signal
    ++updates;
    grad_norm = std::max(grad_norm, s->grad_norm);
    // Fresh samples: π_prox = μ up to f32 recomputation, so weights are 1 and nothing clips.
    EXPECT_NEAR(s->loss.is_weight_mean(), 1.0, 1e-3);
    EXPECT_EQ(s->loss.clipped, 0);
    for (double a : s->routing_agreement) EXPECT_EQ(a, 1.0);  // same weights and biases
  }
  const double after = RewardedMass(*m);
  std::printf("bandit: rewarded mass %.3f -> %.3f in %d updates\n", before, after, updates);
  EXPECT_EQ((*trainer)->version(), updates);
  EXPECT_GE(updates, 3);
  EXPECT_GT(grad_norm, 0);
  // An untrained model puts ~half its mass on even ids; RL must move it clearly upwards.
  EXPECT_GT(after, before + 0.2) << "before " << before << " after " << after;
}

TEST(RlTrainer, StaleSamplesDroppedAndUniformGroupsSkipped) {
  auto m = TinyModel(2);
  auto comm = comm::MakeLocalCommunicator();
  RlTrainerOptions o = Options();
  o.max_staleness = 1;
  auto trainer = RlTrainer::Create(m.get(), comm.get(), o);
  ASSERT_TRUE(trainer.ok());
  auto groups = SampleGroups(*m, 2, 4, 0, 3);
  for (auto& s : groups[1].samples) s.reward = 1.0;  // no signal
  auto s = (*trainer)->Step(groups);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->uniform_groups, 1);
  EXPECT_EQ(s->version, 1);
  EXPECT_EQ(s->staleness.at(0), 4);
  ASSERT_TRUE((*trainer)->Step(SampleGroups(*m, 1, 4, 1, 4)).ok());
  // Version 2 now: samples of version 0 are 2 > η = 1 stale.
  s = (*trainer)->Step(SampleGroups(*m, 2, 4, 0, 5));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->stale_dropped, 8);
  EXPECT_FALSE(s->updated);
  EXPECT_EQ((*trainer)->version(), 2);
  groups = SampleGroups(*m, 1, 2, 2, 6);
  groups[0].samples[0].loss_mask.pop_back();
  EXPECT_FALSE((*trainer)->Step(groups).ok());
}

// R3 on: a sample that lacks its recorded routing is dropped and counted; its group still trains
// on the others, forced. (Before, the whole micro-batch silently ran unforced.) With R3 off the
// same sample is used.
TEST(RlTrainer, SamplesWithoutRoutingAreDroppedAndCountedUnderR3) {
  for (bool replay : {true, false}) {
    auto m = TinyModel(4);
    auto comm = comm::MakeLocalCommunicator();
    RlTrainerOptions o = Options();
    o.routing_replay = replay;
    auto trainer = RlTrainer::Create(m.get(), comm.get(), o);
    ASSERT_TRUE(trainer.ok());
    auto groups = SampleGroups(*m, 2, 4, 0, 12);
    for (auto& g : groups) {  // rewards 1, 0, 0, 1: no group is uniform, with or without sample 1
      for (size_t i = 0; i < g.samples.size(); ++i) g.samples[i].reward = i % 3 == 0 ? 1.0 : 0.0;
    }
    groups[0].samples[1].routed_experts.clear();
    auto s = (*trainer)->Step(groups);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->uniform_groups, 0);
    EXPECT_EQ(s->unrouted_dropped, replay ? 1 : 0);
    EXPECT_EQ(s->samples, replay ? 7 : 8);
    EXPECT_TRUE(s->updated);
  }
}

// Samples an environment fault ended (a tool error of the environment, a timeout, a lost env
// worker) are masked: not trained on with their reward of 0, and not part of their group's
// advantages, so a group whose only dissent was a fault carries no signal.
TEST(RlTrainer, EnvironmentFaultsAreMaskedNotTrainedAsZeroReward) {
  auto m = TinyModel(6);
  auto comm = comm::MakeLocalCommunicator();
  auto trainer = RlTrainer::Create(m.get(), comm.get(), Options());
  ASSERT_TRUE(trainer.ok());
  auto groups = SampleGroups(*m, 2, 4, 0, 21);
  const std::vector<double> r0 = {1, 0, 0, 0}, r1 = {1, 0, 1, 1};
  for (size_t i = 0; i < 4; ++i) {
    groups[0].samples[i].reward = r0[i];
    groups[1].samples[i].reward = r1[i];
  }
  groups[0].samples[1].env_fault = true;  // rewards 1, 0, 0 remain: still a signal
  groups[1].samples[1].env_fault = true;  // rewards 1, 1, 1 remain: none
  auto s = (*trainer)->Step(groups);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->env_fault_dropped, 2);
  EXPECT_EQ(s->uniform_groups, 1);
  EXPECT_EQ(s->samples, 3);
  EXPECT_EQ(s->loss.tokens, 3);  // one answer token each
  EXPECT_TRUE(s->updated);
}

// Several optimizer steps per sampled batch (ppo_epochs x minibatches): after the first, π_θ
// leaves π_prox, so the ratios move off 1 and the clip acts, counted in the loss statistics.
// (With one step per batch nothing can clip: LearnsABandit.) π_prox is the policy before the
// update for every minibatch, so on fresh samples the behaviour weights π_prox/μ stay 1 even for
// the minibatch first trained after a step.
TEST(RlTrainer, SeveralStepsPerBatchMakeTheClipActAndCountIt) {
  auto m = TinyModel(5);
  auto comm = comm::MakeLocalCommunicator();
  RlTrainerOptions o = Options();
  o.lr = 1e-2;
  o.ppo_epochs = 3;
  o.minibatches = 2;
  auto trainer = RlTrainer::Create(m.get(), comm.get(), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto groups = SampleGroups(*m, 4, 8, 0, 31);
  for (auto& g : groups) {  // a signal in every group: rewards 1, 0, 1, 0, ...
    for (size_t i = 0; i < g.samples.size(); ++i) g.samples[i].reward = i % 2 == 0 ? 1.0 : 0.0;
  }
  auto s = (*trainer)->Step(groups);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->updated);
  EXPECT_EQ(s->optimizer_steps, 6);
  EXPECT_EQ((*trainer)->version(), 1);  // one policy version per sampled batch
  EXPECT_EQ(s->samples, 32);
  EXPECT_EQ(s->loss.tokens, 3 * 32);  // every answer token, once per epoch
  std::printf("ppo: %.0f of %.0f token evaluations clipped, mean ratio %.3f\n", s->loss.clipped,
              s->loss.tokens, s->loss.ratio_sum / s->loss.tokens);
  EXPECT_GT(s->loss.clipped, 0);
  EXPECT_GT(s->loss.approx_kl_sum, 0);
  EXPECT_NEAR(s->loss.is_weight_mean(), 1.0, 1e-3);

  RlTrainerOptions bad = Options();
  bad.ppo_epochs = 0;
  EXPECT_FALSE(RlTrainer::Create(m.get(), comm.get(), bad).ok());
  bad = Options();
  bad.minibatches = 0;
  EXPECT_FALSE(RlTrainer::Create(m.get(), comm.get(), bad).ok());
}

TEST(RlTrainer, CheckpointRestoresExactly) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("orrery-rl-ckpt-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  auto m = TinyModel(4);
  auto comm = comm::MakeLocalCommunicator();
  auto trainer = RlTrainer::Create(m.get(), comm.get(), Options());
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Step(SampleGroups(*m, 2, 4, 0, 8)).ok());
  ASSERT_TRUE((*trainer)->SaveCheckpoint(dir.string(), 2).ok());
  std::vector<Tensor> saved;
  for (auto& p : m->parameters()) saved.push_back(p.value.Clone());
  ASSERT_TRUE((*trainer)->Step(SampleGroups(*m, 2, 4, 1, 9)).ok());
  // A fresh model and trainer (a restarted rank) resume from the checkpoint.
  auto m2 = TinyModel(99);
  auto t2 = RlTrainer::Create(m2.get(), comm.get(), Options());
  ASSERT_TRUE(t2.ok());
  ASSERT_TRUE((*t2)->RestoreLatest(dir.string()).ok());
  EXPECT_EQ((*t2)->version(), 1);
  EXPECT_EQ((*t2)->optimizer().step(), 1);
  for (size_t i = 0; i < saved.size(); ++i) {
    const Tensor& a = saved[i];
    const Tensor& b = m2->parameters()[i].value;
    ASSERT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes())) << i;
  }
  EXPECT_FALSE((*t2)->RestoreLatest((dir / "nothing").string()).ok());
  std::filesystem::remove_all(dir);
}

// Two data-parallel ranks as processes (this binary re-executed with the rank in the
// environment): each trains on half of the groups; both must apply the gradient of one rank
// trained on all of them (compared after the all-reduce and clipping, before AdamW: Adam's first
// step is sign-like, so tiny gradients' rounding would blur a parameter comparison).
constexpr int kGroups = 4;

int RunRank(int rank, const std::string& dir) {
  auto m = TinyModel(5);
  comm::GlooOptions go;
  go.rank = rank;
  go.world_size = 2;
  go.store_dir = dir + "/store";
  go.timeout_ms = 60000;
  auto c = comm::CreateGlooCommunicator(go);
  if (!c.ok()) return 2;
  auto trainer = RlTrainer::Create(m.get(), c->get(), Options());
  if (!trainer.ok()) return 3;
  auto all = SampleGroups(*m, kGroups, 4, 0, 11);
  std::vector<PolicyGroup> mine(all.begin() + rank * kGroups / 2,
                                all.begin() + (rank + 1) * kGroups / 2);
  auto s = (*trainer)->Step(mine);
  if (!s.ok() || !s->updated) return 4;
  std::vector<std::pair<std::string, Tensor>> grads;
  for (auto& p : m->parameters()) grads.emplace_back(p.name, p.grad);
  if (!WriteSafetensors(dir + "/rank" + std::to_string(rank) + ".safetensors", grads, {}).ok())
    return 5;
  return 0;
}

TEST(RlTrainerRankChild, Run) {
  const char* rank = std::getenv("ORRERY_RL_TEST_RANK");
  if (rank == nullptr) GTEST_SKIP() << "run by RlTrainer.TwoGlooRanksEqualOneRank";
  std::exit(RunRank(std::atoi(rank), std::getenv("ORRERY_RL_TEST_DIR")));
}

TEST(RlTrainer, TwoGlooRanksEqualOneRank) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("orrery-rl-dp-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("ORRERY_RL_TEST_RANK", std::to_string(r).c_str(), 1);
      setenv("ORRERY_RL_TEST_DIR", dir.c_str(), 1);
      alarm(120);
      execl("/proc/self/exe", "rl_trainer_tests", "--gtest_filter=RlTrainerRankChild.Run",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  // Meanwhile: one rank on everything.
  auto m = TinyModel(5);
  auto comm = comm::MakeLocalCommunicator();
  auto trainer = RlTrainer::Create(m.get(), comm.get(), Options());
  ASSERT_TRUE(trainer.ok());
  ASSERT_TRUE((*trainer)->Step(SampleGroups(*m, kGroups, 4, 0, 11)).ok());
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank exit status " << status;
  }
  for (int r = 0; r < 2; ++r) {
    auto f = SafetensorsFile::Open((dir / ("rank" + std::to_string(r) + ".safetensors")).string());
    ASSERT_TRUE(f.ok());
    double worst = 0, scale = 0;
    for (auto& p : m->parameters()) {
      auto t = f->Get(p.name);
      ASSERT_TRUE(t.ok());
      for (int64_t i = 0; i < p.grad.numel(); ++i) {
        worst = std::max(worst, double(std::abs(t->data<float>()[i] - p.grad.data<float>()[i])));
        scale = std::max(scale, double(std::abs(p.grad.data<float>()[i])));
      }
    }
    // The same gradient up to the order of f32 sums (two partial sums instead of one); a wrong
    // scale or a missing half would be off by O(scale).
    EXPECT_GT(scale, 0);
    EXPECT_LT(worst, 1e-4 * scale) << "rank " << r;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orrery::rl
