// Rollout: sampling against the softmax it claims to draw from; the model backend's continuous
// batching on the decode state against whole-sequence forwards; the agent loop on the calc
// environment, with a scripted test policy (token-exact against the chat format's rendering of the
// same conversation) and with a real random model (behaviour logprobs and R3 routing equal the
// learner's recompute); environment calls off the decode loop (slow tools overlap, a waiting
// episode leaves the batch) and environment faults (marked, counted, not scored).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <thread>

#include "env/calc/calc_env.h"
#include "env/calc/prompt.h"
#include "env/calc/task.h"
#include "kernels/token_sampling.h"
#include "learner/rl/policy_loss.h"
#include "model/chat_format.h"
#include "model/config.h"
#include "model/model.h"
#include "rollout/agent_loop.h"
#include "rollout/gpu_model_backend.h"
#include "rollout/model_backend.h"
#include "rollout/sampling.h"
#include "tests/unit/rollout/agent_test_util.h"

namespace orrery::rollout {
namespace {

std::string SourceDir() {
  const char* d = std::getenv("ORRERY_SOURCE_DIR");
  return d != nullptr ? d : ".";
}

TEST(RolloutSampling, FrequenciesMatchTemperatureSoftmax) {
  const std::vector<float> z = {1.0f, 0.0f, -1.0f, 2.0f};
  SamplingOptions o;
  o.temperature = 0.7;
  PhiloxGenerator rng(5, 0);
  std::vector<int> counts(4, 0);
  const int draws = 40000;
  double sum = 0;
  for (float x : z) sum += std::exp(x / 0.7);
  for (int i = 0; i < draws; ++i) {
    SampledToken t = SampleToken(z.data(), 4, o, rng);
    ++counts[t.id];
    EXPECT_NEAR(t.logprob, z[t.id] / 0.7 - std::log(sum), 1e-5);
  }
  for (int j = 0; j < 4; ++j) {
    const double p = std::exp(z[j] / 0.7) / sum;
    // 5 binomial standard deviations: fails by chance with probability ~1e-6.
    EXPECT_NEAR(counts[j] / double(draws), p, 5 * std::sqrt(p * (1 - p) / draws)) << j;
  }
}

TEST(RolloutSampling, TopPAndGreedy) {
  const std::vector<float> z = {3.0f, 2.9f, -5.0f, -6.0f};
  SamplingOptions o;
  o.top_p = 0.9;  // the first two tokens hold > 99% of the mass
  PhiloxGenerator rng(1, 2);
  for (int i = 0; i < 2000; ++i) EXPECT_LT(SampleToken(z.data(), 4, o, rng).id, 2);
  o.temperature = 0;
  EXPECT_EQ(SampleToken(z.data(), 4, o, rng).id, 0);
  EXPECT_FALSE(ValidateSamplingOptions({1.0, 0.0}).ok());
  EXPECT_FALSE(ValidateSamplingOptions({-1.0, 1.0}).ok());
}

// Logits of several shapes: spread, peaked, quantised to a coarse grid (many exact ties, the
// case the device sampler's tie order must match) and all equal.
std::vector<float> TestLogits(int kind, int64_t v, PhiloxGenerator& rng) {
  std::vector<float> z(static_cast<size_t>(v));
  for (auto& x : z) {
    const double n = rng.Normal();
    switch (kind) {
      case 0:
        x = static_cast<float>(n);
        break;
      case 1:
        x = static_cast<float>(8.0 * n);
        break;
      case 2:
        x = static_cast<float>(std::round(2.0 * n) / 2.0);
        break;
      default:
        x = 0.25f;
    }
  }
  return z;
}

// kernels::SampleTokens' CPU twin (the radix descent the CUDA kernel runs) draws what
// SampleTokenWithUniform draws from the same logits and uniform numbers: every id equal, the
// log-probabilities to rounding, over temperatures (greedy included), nucleus sizes (none, wide,
// narrow, one token) and uniform numbers at and near the ends.
TEST(RolloutSampling, TheDeviceSamplersTwinDrawsWhatSampleTokenDraws) {
  const int64_t v = 197;
  const double temperatures[] = {0.0, 0.3, 1.0, 1.7};
  const double top_ps[] = {1.0, 0.95, 0.5, 0.1, 1e-9};
  PhiloxGenerator rng(71, 1);
  int64_t rows = 0, nucleus_rows = 0;
  double worst_lp = 0;
  for (int kind = 0; kind < 4; ++kind) {
    for (int rep = 0; rep < 6; ++rep) {
      const std::vector<float> z = TestLogits(kind, v, rng);
      std::vector<double> params;
      std::vector<SampledToken> want;
      for (double t : temperatures) {
        for (double top_p : top_ps) {
          for (float u : {0.0f, 1e-7f, rng.Uniform(), rng.Uniform(), rng.Uniform(), 0.9999999f}) {
            params.insert(params.end(), {t, top_p, static_cast<double>(u)});
            want.push_back(SampleTokenWithUniform(z.data(), v, {t, top_p}, u));
          }
        }
      }
      const int64_t n = static_cast<int64_t>(want.size());
      Tensor logits = Tensor::Empty({n, v}, DType::kF32);
      for (int64_t i = 0; i < n; ++i) std::copy(z.begin(), z.end(), logits.data<float>() + i * v);
      Tensor ids, logprobs;
      ASSERT_TRUE(
          kernels::SampleTokens(logits, Tensor::FromVector<double>({n, 3}, params), &ids, &logprobs)
              .ok());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(ids.data<int32_t>()[i], want[i].id)
            << "kind " << kind << " T " << params[i * 3] << " top_p " << params[i * 3 + 1] << " u "
            << params[i * 3 + 2];
        worst_lp = std::max(
            worst_lp, static_cast<double>(std::abs(logprobs.data<float>()[i] - want[i].logprob)));
        nucleus_rows += params[i * 3 + 1] < 1.0 && params[i * 3] > 0;
      }
      rows += n;
    }
  }
  EXPECT_LT(worst_lp, 1e-5);
  EXPECT_GT(nucleus_rows, rows / 2);
  // Bad parameters are one clear line.
  Tensor ids, logprobs;
  const Status st =
      kernels::SampleTokens(Tensor::Zeros({1, 4}, DType::kF32),
                            Tensor::FromVector<double>({1, 3}, {1.0, 0.0, 0.5}), &ids, &logprobs);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("top_p 0"), std::string::npos) << st.message();
}

std::unique_ptr<model::Model> TinyModel(uint64_t seed, DType dtype = DType::kF32) {
  auto config = model::LoadModelConfig(SourceDir() + "/configs/model/tiny.toml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  auto m = model::Model::Create(*config, seed, dtype);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(*m);
}

// Logits and routing of one whole sequence, the learner's way.
void FullForward(model::Model& m, const std::vector<int32_t>& ids, Tensor* logits,
                 Tensor* experts) {
  model::Batch b;
  b.tokens = Tensor::FromVector<int32_t>({1, static_cast<int64_t>(ids.size())}, ids);
  model::ForwardCache cache;
  auto out = m.Forward(b, &cache);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  *logits = *out;
  *experts = cache.StackedExpertIds();
}

TEST(RolloutModelBackend, ContinuousBatchingMatchesWholeSequences) {
  auto m = TinyModel(3);
  auto created = ModelBackend::Create(m.get(), 3, 256);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ModelBackend& backend = **created;
  const std::vector<int32_t> a = {5, 9, 100, 7, 7, 31, 64, 2, 1000, 8};
  const std::vector<int32_t> b = {44, 3, 12, 19, 600, 5};
  // Slot 2 gets a's prefix, then token by token; slot 0 gets all of b at once in between.
  std::vector<std::vector<float>> a_logits;
  auto r = backend.Feed({2}, {{a.begin(), a.begin() + 4}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->expert_ids.dim(1), 4);
  std::vector<int32_t> routed_a(r->expert_ids.data<int32_t>(),
                                r->expert_ids.data<int32_t>() + r->expert_ids.numel());
  const int64_t v = backend.vocab_size();
  const int layers = backend.moe_layers(), k = backend.top_k();
  ASSERT_EQ(layers, 3);
  std::vector<float> last_b;
  for (size_t i = 4; i < a.size(); ++i) {
    std::vector<int> slots = {2};
    std::vector<std::vector<int32_t>> feeds = {{a[i]}};
    if (i == 6) {
      slots.push_back(0);
      feeds.push_back(b);
    }
    auto s = backend.Feed(slots, feeds);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    a_logits.emplace_back(s->logits.data<float>(), s->logits.data<float>() + v);
    if (i == 6) last_b.assign(s->logits.data<float>() + v, s->logits.data<float>() + 2 * v);
  }
  Tensor full, experts;
  FullForward(*m, a, &full, &experts);
  for (size_t i = 4; i < a.size(); ++i) {
    for (int64_t j = 0; j < v; ++j) {
      // The same f32 computation over the same document: equal up to summation order.
      ASSERT_NEAR(a_logits[i - 4][j], full.data<float>()[i * v + j], 1e-4) << i << " " << j;
    }
  }
  // The prefix's routing equals the whole sequence's at those positions.
  for (int l = 0; l < layers; ++l) {
    for (int p = 0; p < 4; ++p) {
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(routed_a[(l * 4 + p) * k + j],
                  experts.data<int32_t>()[(l * a.size() + p) * k + j]);
      }
    }
  }
  FullForward(*m, b, &full, &experts);
  for (int64_t j = 0; j < v; ++j) {
    ASSERT_NEAR(last_b[j], full.data<float>()[(b.size() - 1) * v + j], 1e-4);
  }
  // Bad feeds are one clear error.
  EXPECT_FALSE(backend.Feed({0, 0}, {{1}, {2}}).ok());
  EXPECT_FALSE(backend.Feed({3}, {{1}}).ok());
  EXPECT_FALSE(backend.Feed({1}, {{static_cast<int32_t>(v)}}).ok());
  EXPECT_FALSE(backend.Feed({1}, {std::vector<int32_t>(300, 1)}).ok());
}

TEST(RolloutModelBackend, WeightsRoundTripAndMismatchFails) {
  auto src = TinyModel(11);
  auto dst = TinyModel(12);
  auto created = ModelBackend::Create(dst.get(), 1, 64);
  ASSERT_TRUE(created.ok());
  ModelBackend& backend = **created;
  ASSERT_TRUE(backend.LoadWeights(NamedWeights(*src), 7).ok());
  EXPECT_EQ(backend.version(), 7);
  Tensor l1, l2, e;
  FullForward(*src, {1, 2, 3}, &l1, &e);
  FullForward(*dst, {1, 2, 3}, &l2, &e);
  for (int64_t i = 0; i < l1.numel(); ++i) ASSERT_EQ(l1.data<float>()[i], l2.data<float>()[i]);
  // Each bad set is refused with its one line, before anything is written.
  auto named = NamedWeights(*src);
  const std::string last = named.back().first;
  named.pop_back();
  EXPECT_EQ(backend.LoadWeights(named, 8).message(), "weights: tensor '" + last + "' is missing");
  named = NamedWeights(*src);
  named.emplace_back("layers.99.w", Tensor::Zeros({1}, DType::kF32));
  EXPECT_EQ(backend.LoadWeights(named, 8).message(),
            "weights: the model has no tensor 'layers.99.w'");
  named = NamedWeights(*src);
  for (auto& [name, t] : named) t = Tensor::Zeros(t.shape(), DType::kF32);
  named.back().second = Tensor::Zeros({1}, DType::kF32);  // the last checked: all others are fine
  const std::string shape_line = backend.LoadWeights(named, 8).message();
  EXPECT_NE(shape_line.find("weights: tensor '" + named.back().first + "' is "), std::string::npos)
      << shape_line;
  EXPECT_EQ(backend.version(), 7);
  FullForward(*dst, {1, 2, 3}, &l2, &e);
  for (int64_t i = 0; i < l1.numel(); ++i) ASSERT_EQ(l1.data<float>()[i], l2.data<float>()[i]);
}

TEST(RolloutAgentLoop, ScriptedToolUseIsTokenExact) {
  CalcFixture f;
  std::vector<int32_t> good = f.TurnIds(f.ToolCallTurn());
  const size_t first_turn = good.size();
  auto answer = f.TurnIds(f.AnswerTurn(f.calc_task.answer_text));
  good.insert(good.end(), answer.begin(), answer.end());
  std::vector<int32_t> wrong = f.TurnIds(f.AnswerTurn("123456789"));
  // Two slots, a group of 4: episodes queue until a slot frees (continuous batching).
  ScriptedBackend backend(2, f.tokenizer.vocab_size(), {good, wrong});
  AgentOptions o;
  o.max_turn_tokens = 200;
  o.max_episode_tokens = 2000;
  AgentLoop loop(&backend, f.format.get(), f.env.get(), o);
  loop.AddGroup(f.task, 77, 4);
  auto groups = loop.RunUntilIdle();
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 1u);
  const TrajectoryGroup& g = (*groups)[0];
  EXPECT_EQ(g.group_id, 77u);
  ASSERT_EQ(g.trajectories.size(), 4u);
  int correct = 0;
  for (const Trajectory& t : g.trajectories) {
    EXPECT_EQ(t.status, EpisodeStatus::kFinished);
    EXPECT_EQ(t.task_id, f.task.id);
    correct += t.reward == 1.0;
    // The oracle: the chat format's rendering of the same conversation.
    std::vector<ChatMessage> conv = calc::CalcInitialMessages(f.calc_task);
    if (t.tool_calls.empty()) {
      conv.push_back(f.AnswerTurn("123456789"));
      EXPECT_EQ(t.reward, 0.0);
    } else {
      ASSERT_EQ(t.tool_calls.size(), 1u);
      EXPECT_EQ(t.tool_calls[0].result, f.calc_task.answer_text);
      conv.push_back(f.ToolCallTurn());
      ChatMessage tool;
      tool.role = ChatRole::kTool;
      tool.content = f.calc_task.answer_text;
      tool.tool_call_id = "call_0";
      tool.name = "calculate";
      conv.push_back(tool);
      conv.push_back(f.AnswerTurn(f.calc_task.answer_text));
      EXPECT_EQ(t.reward, 1.0);
    }
    auto want = f.format->Render(conv);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(t.tokens, want->ids);
    EXPECT_EQ(t.loss_mask, want->loss_mask);
    ASSERT_EQ(t.logprobs.size(), t.tokens.size());
    ASSERT_EQ(t.routed_experts.size(), t.tokens.size() * 2);
    for (size_t i = 0; i < t.tokens.size(); ++i) {
      EXPECT_EQ(t.roles[i] == TokenRole::kModel, t.loss_mask[i] == 1);
      if (t.loss_mask[i])
        EXPECT_NEAR(t.logprobs[i], 0.0, 1e-6);  // a one-hot policy
      else
        EXPECT_EQ(t.logprobs[i], 0.0f);
      // Every token but the final (never fed) one carries the backend's routing.
      EXPECT_EQ(t.routed_experts[2 * i], i + 1 < t.tokens.size() ? 5 : 0);
    }
  }
  EXPECT_EQ(correct, 2);
  EXPECT_EQ(loop.stats().tool_calls, 2);
  EXPECT_EQ(loop.stats().episodes_finished, 4);
  (void)first_turn;
}

// An environment that throws from Step and Score, as a careless or hostile plug-in may: the
// calc environment's episodes behind an Episode whose calls raise std::runtime_error.
class ThrowingEnv : public env::Env {
 public:
  explicit ThrowingEnv(env::Env* inner) : inner_(inner) {}
  std::string name() const override { return "throwing"; }
  StatusOr<env::TaskRef> Task(env::Split split, uint64_t index) const override {
    return inner_->Task(split, index);
  }
  StatusOr<std::unique_ptr<env::Episode>> Reset(const env::TaskRef& task,
                                                env::Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<env::Episode> e, inner_->Reset(task, deadline));
    return std::unique_ptr<env::Episode>(std::make_unique<Episode>(std::move(e)));
  }

 private:
  class Episode : public env::Episode {
   public:
    explicit Episode(std::unique_ptr<env::Episode> inner) : inner_(std::move(inner)) {}
    const std::vector<ChatMessage>& initial_messages() const override {
      return inner_->initial_messages();
    }
    const std::vector<env::ToolSpec>& tools() const override { return inner_->tools(); }
    StatusOr<env::ToolResult> Step(const ToolCall&, env::Deadline) override {
      throw std::runtime_error("boom in step");
    }
    StatusOr<env::EpisodeScore> Score(const std::vector<ChatMessage>&, env::Deadline) override {
      throw std::runtime_error("boom in score");
    }

   private:
    std::unique_ptr<env::Episode> inner_;
  };
  env::Env* inner_;
};

TEST(RolloutAgentLoop, AnEnvironmentThatThrowsFailsItsEpisodesNotTheLoop) {
  CalcFixture f;
  std::vector<int32_t> call = f.TurnIds(f.ToolCallTurn());
  auto answer = f.TurnIds(f.AnswerTurn(f.calc_task.answer_text));
  call.insert(call.end(), answer.begin(), answer.end());
  ScriptedBackend backend(2, f.tokenizer.vocab_size(), {call, answer});
  ThrowingEnv env(f.env.get());
  AgentOptions o;
  o.max_turn_tokens = 200;
  o.max_episode_tokens = 2000;
  AgentLoop loop(&backend, f.format.get(), &env, o);
  loop.AddGroup(f.task, 5, 4);
  auto groups = loop.RunUntilIdle();
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 1u);
  int step_errors = 0;
  for (const Trajectory& t : (*groups)[0].trajectories) {
    // A step or the score threw: an environment fault, whatever the answer, not a reward of 0.
    EXPECT_EQ(t.status, EpisodeStatus::kToolError);
    EXPECT_TRUE(t.env_fault());
    EXPECT_EQ(t.reward, 0.0);
    if (t.tool_calls.empty()) continue;
    ++step_errors;
    ASSERT_EQ(t.tool_calls.size(), 1u);
    EXPECT_NE(t.tool_calls[0].error.find("env step threw: boom in step"), std::string::npos)
        << t.tool_calls[0].error;
  }
  EXPECT_EQ(step_errors, 2);
  // Two steps failed (those episodes are not scored) and two scores failed, each counted.
  EXPECT_EQ(loop.stats().env_failures, 4);
  EXPECT_EQ(loop.stats().env_tool_errors, 4);
}

// The calc environment with a fault injected into Step (a Status the environment returns, as
// env/env.h says its failures look), a delay before each step, and counted Score calls.
class FaultyEnv : public env::Env {
 public:
  FaultyEnv(env::Env* inner, Status step_status, double step_sleep_s = 0)
      : inner_(inner), step_status_(std::move(step_status)), step_sleep_s_(step_sleep_s) {}
  std::string name() const override { return "faulty"; }
  StatusOr<env::TaskRef> Task(env::Split split, uint64_t index) const override {
    return inner_->Task(split, index);
  }
  StatusOr<std::unique_ptr<env::Episode>> Reset(const env::TaskRef& task,
                                                env::Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<env::Episode> e, inner_->Reset(task, deadline));
    return std::unique_ptr<env::Episode>(std::make_unique<Episode>(this, std::move(e)));
  }
  std::atomic<int> scores{0};

 private:
  class Episode : public env::Episode {
   public:
    Episode(FaultyEnv* env, std::unique_ptr<env::Episode> inner)
        : env_(env), inner_(std::move(inner)) {}
    const std::vector<ChatMessage>& initial_messages() const override {
      return inner_->initial_messages();
    }
    const std::vector<env::ToolSpec>& tools() const override { return inner_->tools(); }
    StatusOr<env::ToolResult> Step(const ToolCall& call, env::Deadline deadline) override {
      if (env_->step_sleep_s_ > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(env_->step_sleep_s_));
      }
      if (!env_->step_status_.ok()) return env_->step_status_;
      return inner_->Step(call, deadline);
    }
    StatusOr<env::EpisodeScore> Score(const std::vector<ChatMessage>& t,
                                      env::Deadline deadline) override {
      ++env_->scores;
      return inner_->Score(t, deadline);
    }

   private:
    FaultyEnv* env_;
    std::unique_ptr<env::Episode> inner_;
  };
  env::Env* inner_;
  Status step_status_;
  double step_sleep_s_;
};

// Each kind of environment fault ends the episode with its own status, unscored, and is counted;
// the episodes that made no tool call are scored as usual.
TEST(RolloutAgentLoop, EnvironmentFaultsAreMarkedCountedAndNotScored) {
  struct Case {
    Status status;
    EpisodeStatus want;
    int64_t AgentStats::*counter;
  };
  const std::vector<Case> cases = {
      {InternalError("sandbox could not start"), EpisodeStatus::kToolError,
       &AgentStats::env_tool_errors},
      {DeadlineExceededError("no reply before the deadline"), EpisodeStatus::kTimeout,
       &AgentStats::env_timeouts},
      {UnavailableError("episode lost: the env server restarted"), EpisodeStatus::kEnvLost,
       &AgentStats::env_lost},
  };
  for (const Case& c : cases) {
    CalcFixture f;
    std::vector<int32_t> call = f.TurnIds(f.ToolCallTurn());
    auto answer = f.TurnIds(f.AnswerTurn(f.calc_task.answer_text));
    call.insert(call.end(), answer.begin(), answer.end());
    ScriptedBackend backend(2, f.tokenizer.vocab_size(), {call, answer});
    FaultyEnv env(f.env.get(), c.status);
    AgentOptions o;
    o.max_turn_tokens = 200;
    o.max_episode_tokens = 2000;
    o.env_workers = 2;
    AgentLoop loop(&backend, f.format.get(), &env, o);
    loop.AddGroup(f.task, 5, 4);
    auto groups = loop.RunUntilIdle();
    ASSERT_TRUE(groups.ok()) << groups.status().ToString();
    ASSERT_EQ(groups->size(), 1u);
    int faults = 0, scored = 0;
    for (const Trajectory& t : (*groups)[0].trajectories) {
      if (t.tool_calls.empty()) {
        EXPECT_EQ(t.status, EpisodeStatus::kFinished);
        EXPECT_EQ(t.reward, 1.0);
        ++scored;
        continue;
      }
      EXPECT_EQ(t.status, c.want) << c.status.ToString();
      EXPECT_TRUE(t.env_fault());
      ASSERT_EQ(t.tool_calls.size(), 1u);
      EXPECT_NE(t.tool_calls[0].error.find(c.status.message()), std::string::npos);
      ++faults;
    }
    EXPECT_EQ(faults, 2);
    EXPECT_EQ(env.scores.load(), scored);  // faulted episodes are not scored
    EXPECT_EQ(loop.stats().*c.counter, 2) << c.status.ToString();
    EXPECT_EQ(loop.stats().env_failures, 2);
    EXPECT_EQ(loop.stats().env_calls_in_flight, 0);
  }
}

// Issue 26's scenario: a tool that sleeps 1 s, 16 concurrent episodes of 2 tool calls each. The
// calls run on env workers while the loop keeps stepping, so the whole run takes about 2 s of tool
// time; with the calls on the decode loop it took 32 s.
TEST(RolloutAgentLoop, SlowToolCallsOfManyEpisodesOverlap) {
  CalcFixture f;
  std::vector<int32_t> script = f.TurnIds(f.ToolCallTurn());
  auto again = f.TurnIds(f.ToolCallTurn());
  auto answer = f.TurnIds(f.AnswerTurn(f.calc_task.answer_text));
  script.insert(script.end(), again.begin(), again.end());
  script.insert(script.end(), answer.begin(), answer.end());
  ScriptedBackend backend(16, f.tokenizer.vocab_size(), {script});
  FaultyEnv env(f.env.get(), Status::OK(), /*step_sleep_s=*/1.0);
  AgentOptions o;
  o.max_turn_tokens = 200;
  o.max_episode_tokens = 4000;
  o.env_workers = 16;  // the rollout role's choice: one per slot
  AgentLoop loop(&backend, f.format.get(), &env, o);
  loop.AddGroup(f.task, 1, 8);
  loop.AddGroup(f.task, 2, 8);
  const auto start = std::chrono::steady_clock::now();
  auto groups = loop.RunUntilIdle();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 2u);
  for (const TrajectoryGroup& g : *groups) {
    for (const Trajectory& t : g.trajectories) {
      EXPECT_EQ(t.status, EpisodeStatus::kFinished);
      EXPECT_EQ(t.tool_calls.size(), 2u);
      EXPECT_EQ(t.reward, 1.0);
      EXPECT_GE(t.tool_seconds, 2.0);
    }
  }
  EXPECT_EQ(loop.stats().tool_calls, 32);
  std::printf("16 episodes x 2 tool calls of 1 s: %.2f s\n", seconds);
  // Generous: two rounds of 1 s calls plus scheduling on a loaded machine (32 s in series).
  EXPECT_LT(seconds, 8.0);
}

// While one episode waits for a slow tool, another keeps decoding and finishes.
TEST(RolloutAgentLoop, AnEpisodeWaitingForAToolLeavesTheDecodeBatch) {
  CalcFixture f;
  std::vector<int32_t> call = f.TurnIds(f.ToolCallTurn());
  auto answer = f.TurnIds(f.AnswerTurn(f.calc_task.answer_text));
  call.insert(call.end(), answer.begin(), answer.end());
  // A long direct answer: more tokens than the other episode's tool-call turn.
  auto long_answer = f.TurnIds(f.AnswerTurn(std::string(300, '7')));
  ScriptedBackend backend(2, f.tokenizer.vocab_size(), {call, long_answer});
  FaultyEnv env(f.env.get(), Status::OK(), /*step_sleep_s=*/1.5);
  AgentOptions o;
  o.max_turn_tokens = 400;
  o.max_episode_tokens = 4000;
  o.env_workers = 2;
  AgentLoop loop(&backend, f.format.get(), &env, o);
  loop.AddGroup(f.task, 1, 1);
  loop.AddGroup(f.task, 2, 1);
  auto groups = loop.RunUntilIdle();
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 2u);
  // The answerer's group completes first. Which group answers depends on which Reset finished
  // first (Resets run on the env workers, and the first episode fed gets the first script), so the
  // check is on the trajectories, not on the group ids.
  const Trajectory& answerer = (*groups)[0].trajectories[0];
  const Trajectory& tool_user = (*groups)[1].trajectories[0];
  ASSERT_EQ(tool_user.tool_calls.size(), 1u) << "the tool user's group completed first";
  ASSERT_TRUE(answerer.tool_calls.empty());
  EXPECT_NE((*groups)[0].group_id, (*groups)[1].group_id);
  EXPECT_GE(tool_user.tool_seconds, 1.5);
  // The answerer's tokens after the other's tool call were decoded during it, not after.
  EXPECT_LT(answerer.total_seconds, 1.0) << "the answerer waited for the other episode's tool";
}

// An episode budget shorter than the prompt ends each such episode as a counted environment fault
// with the reason logged, not as an empty "truncated" episode (a fleet with it produced thousands
// of those silently and never updated), and the loop, the actor, goes on: the prompt is the
// task's, which a plug-in chooses.
TEST(RolloutAgentLoop, APromptLongerThanTheEpisodeBudgetIsACountedFault) {
  CalcFixture f;
  ScriptedBackend backend(2, f.tokenizer.vocab_size(), {{f.tokenizer.Encode("7")[0]}});
  AgentOptions o;
  o.max_episode_tokens = 10;
  AgentLoop loop(&backend, f.format.get(), f.env.get(), o);
  loop.AddGroup(f.task, 1, 2);
  auto groups = loop.RunUntilIdle();
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 1u);
  for (const Trajectory& t : (*groups)[0].trajectories) {
    EXPECT_TRUE(t.env_fault()) << EpisodeStatusName(t.status);
    EXPECT_EQ(t.model_tokens(), 0);
  }
  EXPECT_EQ(loop.stats().env_tool_errors, 2);
  EXPECT_EQ(loop.stats().tokens_generated, 0);
}

TEST(RolloutAgentLoop, LimitsTruncateAndVersionsFollowUpdates) {
  CalcFixture f;
  // A policy that never closes its turn.
  ScriptedBackend backend(3, f.tokenizer.vocab_size(), {{f.tokenizer.Encode("7")[0]}});
  AgentOptions o;
  o.max_turn_tokens = 10;
  AgentLoop loop(&backend, f.format.get(), f.env.get(), o);
  loop.AddGroup(f.task, 1, 3);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(loop.Step().ok());
  ASSERT_TRUE(loop.UpdateWeights({}, 1).ok());  // a new version mid-episode
  auto groups = loop.RunUntilIdle();
  ASSERT_TRUE(groups.ok());
  ASSERT_EQ(groups->size(), 1u);
  for (const Trajectory& t : (*groups)[0].trajectories) {
    EXPECT_EQ(t.status, EpisodeStatus::kTruncated);
    EXPECT_EQ(t.model_tokens(), 10);
    EXPECT_EQ(t.min_policy_version(), 0);
    int v0 = 0, v1 = 0;
    for (size_t i = 0; i < t.tokens.size(); ++i) {
      if (t.roles[i] != TokenRole::kModel) continue;
      (t.policy_versions[i] == 0 ? v0 : v1)++;
    }
    // Sampled in steps 2 to 4: the first feeds the group's shared prompt but its last token.
    EXPECT_EQ(v0, 3);
    EXPECT_EQ(v1, 7);
  }
  // Counted by the limit that ended them: the turn's, not the context's.
  EXPECT_EQ(loop.stats().truncated_turn_tokens, 3);
  EXPECT_EQ(loop.stats().truncated_context, 0);
  EXPECT_EQ(loop.stats().truncated_turns, 0);

  // The same policy with room for fewer tokens than the turn limit: the context ends them.
  ScriptedBackend small(3, f.tokenizer.vocab_size(), {{f.tokenizer.Encode("7")[0]}});
  AgentOptions c = o;
  c.max_episode_tokens = static_cast<int>(groups->at(0).trajectories[0].size()) - 4;
  AgentLoop context_loop(&small, f.format.get(), f.env.get(), c);
  context_loop.AddGroup(f.task, 2, 2);
  ASSERT_TRUE(context_loop.RunUntilIdle().ok());
  EXPECT_EQ(context_loop.stats().truncated_context, 2);
  EXPECT_EQ(context_loop.stats().truncated_turn_tokens, 0);
}

TEST(RolloutAgentLoop, RealModelLogprobsAndRoutingMatchTheLearner) {
  CalcFixture f;
  auto m = TinyModel(21, DType::kF64);  // f64: routing near-ties cannot flip between paths
  auto created = ModelBackend::Create(m.get(), 3, 512);
  ASSERT_TRUE(created.ok());
  ModelBackend& backend = **created;
  AgentOptions o;
  o.max_turn_tokens = 6;
  o.max_episode_tokens = 400;
  o.seed = 9;
  AgentLoop loop(&backend, f.format.get(), f.env.get(), o);
  loop.AddGroup(f.task, 5, 4);
  auto groups = loop.RunUntilIdle();
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 1u);
  for (const Trajectory& t : (*groups)[0].trajectories) {
    ASSERT_GT(t.model_tokens(), 0);
    Tensor logits, experts;
    FullForward(*m, t.tokens, &logits, &experts);
    // Targets: token i+1 predicted at position i.
    std::vector<int32_t> targets(t.tokens.size(), -1);
    for (size_t i = 0; i + 1 < t.tokens.size(); ++i) targets[i] = t.tokens[i + 1];
    auto logp = rl::TokenLogprobs(logits, targets);
    ASSERT_TRUE(logp.ok());
    for (size_t i = 1; i < t.tokens.size(); ++i) {
      if (!t.loss_mask[i]) continue;
      EXPECT_NEAR(t.logprobs[i], (*logp)[i - 1], 2e-4) << i;
    }
    const int layers = t.moe_layers, k = t.top_k;
    const int64_t n = t.size();
    for (int64_t p = 0; p + 1 < n; ++p) {
      for (int l = 0; l < layers; ++l) {
        for (int j = 0; j < k; ++j) {
          ASSERT_EQ(t.routed_experts[(p * layers + l) * k + j],
                    experts.data<int32_t>()[(l * n + p) * k + j]);
        }
      }
    }
  }
}

// The agent loop over a backend that samples itself draws what the host draws from the same
// logits: the CPU backend with the device sampler's twin (kernels::SampleTokens) against the
// default FeedAndSample (Feed, then SampleToken), and the GPU backend on the ops' CPU twins
// (sampling inside its fixed-shape decode step and its prefill) against the same backend type
// through the default path. Same seed: the same tokens, log-probabilities to rounding.
class TwinSamplingBackend : public ForwardingBackend {
 public:
  explicit TwinSamplingBackend(PolicyBackend* inner) : ForwardingBackend(inner) {}
  StatusOr<SampledFeed> FeedAndSample(const std::vector<int>& slots,
                                      const std::vector<std::vector<int32_t>>& tokens,
                                      const std::vector<SlotDraw>& draws) override {
    ORRERY_ASSIGN_OR_RETURN(FeedResult fed, inner_->Feed(slots, tokens));
    std::vector<double> params;
    for (const SlotDraw& d : draws) {
      params.insert(params.end(), {d.options.temperature, d.options.top_p, d.uniform});
    }
    const int64_t n = static_cast<int64_t>(slots.size());
    Tensor ids, logprobs;
    ORRERY_RETURN_IF_ERROR(kernels::SampleTokens(
        fed.logits, Tensor::FromVector<double>({n, 3}, params), &ids, &logprobs));
    SampledFeed out;
    out.expert_ids = fed.expert_ids;
    for (int64_t i = 0; i < n; ++i) {
      out.tokens.push_back({ids.data<int32_t>()[i], logprobs.data<float>()[i]});
    }
    return out;
  }
};

// A backend that takes the default FeedAndSample of whatever it wraps.
class HostSamplingBackend : public TwinSamplingBackend {
 public:
  using TwinSamplingBackend::TwinSamplingBackend;
  StatusOr<SampledFeed> FeedAndSample(const std::vector<int>& slots,
                                      const std::vector<std::vector<int32_t>>& tokens,
                                      const std::vector<SlotDraw>& draws) override {
    return PolicyBackend::FeedAndSample(slots, tokens, draws);  // Feed, then SampleToken
  }
};

std::vector<Trajectory> RunEpisodes(PolicyBackend* backend, const CalcFixture& f,
                                    const SamplingOptions& sampling) {
  AgentOptions o;
  o.max_turn_tokens = 8;
  o.max_episode_tokens = 400;
  o.seed = 13;
  o.sampling = sampling;
  AgentLoop loop(backend, f.format.get(), f.env.get(), o);
  loop.AddGroup(f.task, 5, 3);
  auto groups = loop.RunUntilIdle();
  EXPECT_TRUE(groups.ok()) << groups.status().ToString();
  if (!groups.ok() || groups->size() != 1) return {};
  return (*groups)[0].trajectories;
}

void ExpectSameEpisodes(const std::vector<Trajectory>& a, const std::vector<Trajectory>& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t e = 0; e < a.size(); ++e) {
    ASSERT_EQ(a[e].tokens, b[e].tokens) << "episode " << e;
    ASSERT_EQ(a[e].logprobs.size(), b[e].logprobs.size());
    for (size_t i = 0; i < a[e].logprobs.size(); ++i) {
      EXPECT_NEAR(a[e].logprobs[i], b[e].logprobs[i], 1e-5) << e << " " << i;
    }
    EXPECT_EQ(a[e].routed_experts, b[e].routed_experts);
    EXPECT_GT(a[e].model_tokens(), 0);
  }
}

TEST(RolloutAgentLoop, BackendsThatSampleThemselvesDrawWhatTheHostDraws) {
  CalcFixture f;
  for (const SamplingOptions& sampling :
       {SamplingOptions{1.0, 1.0}, SamplingOptions{0.8, 0.7}, SamplingOptions{0.0, 1.0}}) {
    auto m = TinyModel(23);
    auto cpu = ModelBackend::Create(m.get(), 3, 512);
    ASSERT_TRUE(cpu.ok());
    HostSamplingBackend host_side(cpu->get());
    const std::vector<Trajectory> want = RunEpisodes(&host_side, f, sampling);
    auto cpu2 = ModelBackend::Create(m.get(), 3, 512);
    ASSERT_TRUE(cpu2.ok());
    TwinSamplingBackend twin(cpu2->get());
    ExpectSameEpisodes(RunEpisodes(&twin, f, sampling), want);

    GpuBackendOptions go;
    go.model.device = Device::Cpu();
    go.model.compute_dtype = DType::kF32;
    go.max_slots = 3;
    go.max_context = 512;
    go.page_size = 16;
    auto gpu_a = GpuModelBackend::Create(*m, go);
    ASSERT_TRUE(gpu_a.ok()) << gpu_a.status().ToString();
    auto gpu_b = GpuModelBackend::Create(*m, go);
    ASSERT_TRUE(gpu_b.ok()) << gpu_b.status().ToString();
    HostSamplingBackend gpu_host_side(gpu_b->get());
    ExpectSameEpisodes(RunEpisodes(gpu_a->get(), f, sampling),
                       RunEpisodes(&gpu_host_side, f, sampling));
    EXPECT_GT((*gpu_a)->state().decode_stats().eager_steps, 0);
  }
}

// The tokens before an episode's first model token: its prompt.
int64_t PromptTokens(const Trajectory& t) {
  int64_t n = 0;
  while (n < t.size() && t.roles[static_cast<size_t>(n)] != TokenRole::kModel) ++n;
  return n;
}

// A group's prompt is prefilled once: the first episode feeds it but its last token, the others
// get a copy of that slot (CopySlot) and each feeds only the last token. The trajectories are
// those of separate prefills (f64: routing near-ties cannot flip between the paths), and the
// prompt's prefill tokens drop G-fold: (n - 1) instead of G n. With env workers the Resets return
// one by one; the result is the same.
TEST(RolloutAgentLoop, AGroupsPromptIsPrefilledOnce) {
  CalcFixture f;
  auto m = TinyModel(21, DType::kF64);
  const int g = 4;
  for (int workers : {0, 2}) {
    AgentOptions o;
    o.max_turn_tokens = 6;
    o.max_episode_tokens = 400;
    o.seed = 9;
    o.env_workers = workers;
    auto run = [&](bool share, AgentStats* stats, int64_t* prefill) {
      auto created = ModelBackend::Create(m.get(), g, 512);
      EXPECT_TRUE(created.ok());
      CountingBackend counted(created->get());
      o.share_prompts = share;
      auto groups = RunAgent(&counted, f, o, 1, g, stats, [] {});
      *prefill = counted.prefill_tokens;
      return groups;
    };
    AgentStats with, without;
    int64_t prefill_with = 0, prefill_without = 0;
    const auto a = run(true, &with, &prefill_with);
    const auto b = run(false, &without, &prefill_without);
    ExpectSameTrajectories(a, b, 1e-6);
    ASSERT_EQ(a.size(), 1u);
    const int64_t n = PromptTokens(a[0].trajectories[0]);
    ASSERT_GT(n, 50);
    // Tool results are fed alike in both runs; the prompts are not.
    const int64_t tools = prefill_without - g * n;
    if (workers == 0) {  // every Reset is back before the first feed: all G share
      EXPECT_EQ(prefill_with - tools, n - 1) << "the prompt's prefill, once";
      EXPECT_EQ(with.prompt_tokens_shared, (g - 1) * (n - 1));
    }
    // Whichever siblings shared, each copy saved its prefix and nothing else changed.
    EXPECT_EQ(with.prompt_tokens_shared % (n - 1), 0);
    EXPECT_EQ(with.tokens_fed + with.prompt_tokens_shared, without.tokens_fed);
    EXPECT_EQ(without.prompt_tokens_shared, 0);
  }
}

// Continuous batching with a token budget: no step feeds more than max_step_tokens, decodes go
// beside prefill chunks (a prompt is fed over several steps, sampled after its last chunk), and
// the trajectories are the unbudgeted loop's. A budget below the slots is refused.
TEST(RolloutAgentLoop, AStepNeverFeedsMoreThanItsBudget) {
  CalcFixture f;
  auto m = TinyModel(21, DType::kF64);
  AgentOptions o;
  o.max_turn_tokens = 6;
  o.max_episode_tokens = 400;
  o.seed = 5;
  auto cpu_a = ModelBackend::Create(m.get(), 4, 512);
  ASSERT_TRUE(cpu_a.ok());
  auto cpu_b = ModelBackend::Create(m.get(), 4, 512);
  ASSERT_TRUE(cpu_b.ok());
  CountingBackend unbounded(cpu_a->get()), bounded(cpu_b->get());
  AgentStats free_stats, budget_stats;
  const auto want = RunAgent(&unbounded, f, o, 3, 2, &free_stats, [&] { unbounded.EndStep(); });
  o.max_step_tokens = 16;
  const auto got = RunAgent(&bounded, f, o, 3, 2, &budget_stats, [&] { bounded.EndStep(); });
  ExpectSameTrajectories(got, want, 1e-6);
  EXPECT_GT(unbounded.max_step_tokens, 100) << "unbounded, a step takes whole prompts";
  EXPECT_LE(bounded.max_step_tokens, 16);
  EXPECT_GT(bounded.mixed_steps, 0) << "prefill chunks beside decodes";
  EXPECT_GT(budget_stats.chunked_feeds, 0);
  // The same tokens fed (less what copied prompts saved: which siblings share depends on when
  // slots free up).
  EXPECT_EQ(budget_stats.tokens_fed + budget_stats.prompt_tokens_shared,
            free_stats.tokens_fed + free_stats.prompt_tokens_shared);
  EXPECT_GT(budget_stats.steps, free_stats.steps);

  auto created = ModelBackend::Create(m.get(), 4, 512);
  ASSERT_TRUE(created.ok());
  o.max_step_tokens = 3;
  AgentLoop loop(created->get(), f.format.get(), f.env.get(), o);
  loop.AddGroup(f.task, 1, 1);
  auto step = loop.Step();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(step.status().message().find("max_step_tokens = 3 is below the 4 slots"),
            std::string::npos)
      << step.status().message();
  o.max_step_tokens = -1;
  EXPECT_FALSE(ValidateAgentOptions(o).ok());
}

// Admission control on the CPU backend's context pool (ModelBackend's context_tokens): a pool that
// holds one episode and a few tokens more. Episodes wait in the queue and before feeds, some are
// preempted and fed again, none is truncated or failed, every trajectory is the unconstrained
// run's, and the pool is empty when the loop is idle. (The same on the GPU backend's pages:
// GpuBackendCpuTest.AgentOnAnOverSubscribedPoolWaitsAndFinishesEveryEpisode.)
TEST(RolloutAgentLoop, AnOverSubscribedContextPoolMakesEpisodesWait) {
  CalcFixture f;
  auto m = TinyModel(21, DType::kF64);
  AgentOptions o;
  o.max_turn_tokens = 6;
  o.max_episode_tokens = 400;
  o.seed = 7;
  auto roomy = ModelBackend::Create(m.get(), 4, 512);
  ASSERT_TRUE(roomy.ok());
  AgentStats free_stats, tight_stats;
  const auto want = RunAgent(roomy->get(), f, o, 3, 2, &free_stats, [] {});
  ASSERT_EQ(want.size(), 3u);
  int64_t longest = 0;
  for (const auto& g : want) {
    for (const auto& t : g.trajectories) longest = std::max(longest, t.size());
  }
  auto tight = ModelBackend::Create(m.get(), 4, 512, longest + 4);
  ASSERT_TRUE(tight.ok());
  EXPECT_EQ((*tight)->context_capacity(), longest + 4);
  const auto got = RunAgent(tight->get(), f, o, 3, 2, &tight_stats,
                            [&] { EXPECT_GE((*tight)->free_context(), 0); });
  ExpectSameTrajectories(got, want, 1e-6);
  std::printf("pool of %lld tokens: %lld admission waits, %lld context waits, %lld preemptions\n",
              static_cast<long long>(longest + 4),
              static_cast<long long>(tight_stats.admission_waits),
              static_cast<long long>(tight_stats.context_waits),
              static_cast<long long>(tight_stats.preemptions));
  EXPECT_GT(tight_stats.admission_waits, 0);
  EXPECT_GT(tight_stats.context_waits, 0);
  EXPECT_GT(tight_stats.preemptions, 0);
  EXPECT_EQ(tight_stats.episodes_finished, 6);
  EXPECT_EQ((*tight)->free_context(), longest + 4);

  // A pool too small for one episode is the step's error, not a hang or a truncation.
  auto tiny = ModelBackend::Create(m.get(), 2, 512, 20);
  ASSERT_TRUE(tiny.ok());
  AgentLoop loop(tiny->get(), f.format.get(), f.env.get(), o);
  loop.AddGroup(f.task, 1, 1);
  Status failed = Status::OK();
  for (int i = 0; i < 100 && failed.ok() && !loop.idle(); ++i) failed = loop.Step().status();
  EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted) << failed.ToString();
  EXPECT_NE(failed.message().find("of 20 context tokens free"), std::string::npos)
      << failed.message();
}

}  // namespace
}  // namespace orrery::rollout
