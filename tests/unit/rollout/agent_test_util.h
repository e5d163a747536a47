// Test doubles for the agent loop: a scripted policy backend, a counting wrapper, the calc
// environment with a tokenizer, chat format and one task, and runs of the loop compared (shared by
// the rollout, GPU-backend and remote-environment tests).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "env/calc/calc_env.h"
#include "env/calc/prompt.h"
#include "env/calc/task.h"
#include "model/chat_format.h"
#include "rollout/agent_loop.h"
#include "rollout/policy_backend.h"

namespace orrery::rollout {

// A test double: every draw puts all the mass on the next token of its slot's script (a slot
// takes the next script at its first feed). Feeds that draw nothing (chunks, a shared prompt's
// prefix) do not advance the script; a slot given another's context by CopySlot starts its own.
class ScriptedBackend : public PolicyBackend {
 public:
  ScriptedBackend(int slots, int64_t vocab, std::vector<std::vector<int32_t>> scripts)
      : vocab_(vocab), scripts_(std::move(scripts)), cursor_(slots, 0), owner_(slots, -1) {}
  int64_t vocab_size() const override { return vocab_; }
  int moe_layers() const override { return 2; }
  int top_k() const override { return 1; }
  int max_slots() const override { return static_cast<int>(cursor_.size()); }
  int64_t max_context() const override { return 4096; }
  StatusOr<FeedResult> Feed(const std::vector<int>& slots,
                            const std::vector<std::vector<int32_t>>& tokens) override {
    FeedResult r;
    r.logits = Tensor::Zeros({static_cast<int64_t>(slots.size()), vocab_}, DType::kF32);
    int64_t fed = 0;
    for (const auto& t : tokens) fed += static_cast<int64_t>(t.size());
    r.expert_ids = Tensor::Empty({2, fed, 1}, DType::kI32);
    for (int64_t i = 0; i < 2 * fed; ++i) r.expert_ids.data<int32_t>()[i] = 5;
    for (size_t i = 0; i < slots.size(); ++i) {
      const int s = slots[i];
      if (owner_[s] < 0) owner_[s] = next_script_++ % static_cast<int>(scripts_.size());
      const auto& script = scripts_[owner_[s]];
      const int32_t next = script[std::min<size_t>(cursor_[s], script.size() - 1)];
      r.logits.data<float>()[i * vocab_ + next] = 100.0f;
    }
    return r;
  }
  StatusOr<SampledFeed> FeedAndSample(const std::vector<int>& slots,
                                      const std::vector<std::vector<int32_t>>& tokens,
                                      const std::vector<SlotDraw>& draws) override {
    auto r = PolicyBackend::FeedAndSample(slots, tokens, draws);
    if (r.ok()) {
      for (int s : slots) ++cursor_[s];
    }
    return r;
  }
  void Release(int slot) override {
    cursor_[slot] = 0;
    owner_[slot] = -1;
  }
  Status CopySlot(int, int dst) override {
    Release(dst);
    return Status::OK();
  }
  Status LoadWeights(const std::vector<std::pair<std::string, Tensor>>&, int64_t v) override {
    version_ = v;
    return Status::OK();
  }
  int64_t version() const override { return version_; }

 private:
  int64_t vocab_;
  std::vector<std::vector<int32_t>> scripts_;
  std::vector<size_t> cursor_;
  std::vector<int> owner_;
  int next_script_ = 0;
  int64_t version_ = 0;
};

// A backend that forwards every call to `inner`: the base of the test decorators, which override
// only what they change.
class ForwardingBackend : public PolicyBackend {
 public:
  explicit ForwardingBackend(PolicyBackend* inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int moe_layers() const override { return inner_->moe_layers(); }
  int top_k() const override { return inner_->top_k(); }
  int max_slots() const override { return inner_->max_slots(); }
  int64_t max_context() const override { return inner_->max_context(); }
  StatusOr<FeedResult> Feed(const std::vector<int>& slots,
                            const std::vector<std::vector<int32_t>>& tokens) override {
    return inner_->Feed(slots, tokens);
  }
  StatusOr<SampledFeed> FeedAndSample(const std::vector<int>& slots,
                                      const std::vector<std::vector<int32_t>>& tokens,
                                      const std::vector<SlotDraw>& draws) override {
    return inner_->FeedAndSample(slots, tokens, draws);
  }
  void Release(int slot) override { inner_->Release(slot); }
  Status CopySlot(int src, int dst) override { return inner_->CopySlot(src, dst); }
  int64_t context_capacity() const override { return inner_->context_capacity(); }
  int64_t free_context() const override { return inner_->free_context(); }
  int64_t FeedCost(int slot, int64_t tokens) const override {
    return inner_->FeedCost(slot, tokens);
  }
  int64_t CopyCost(int src) const override { return inner_->CopyCost(src); }
  Status LoadWeights(const std::vector<std::pair<std::string, Tensor>>& named,
                     int64_t version) override {
    return inner_->LoadWeights(named, version);
  }
  int64_t version() const override { return inner_->version(); }

 protected:
  PolicyBackend* inner_;
};

// Forwards everything to `inner` and counts what is fed: tokens in all, tokens of multi-token
// feeds (prefill), and per step (the caller calls EndStep after each AgentLoop::Step) the tokens of
// the step's calls, their maximum, and the steps that mixed single-token feeds with longer ones.
class CountingBackend : public ForwardingBackend {
 public:
  explicit CountingBackend(PolicyBackend* inner) : ForwardingBackend(inner) {}
  StatusOr<FeedResult> Feed(const std::vector<int>& slots,
                            const std::vector<std::vector<int32_t>>& tokens) override {
    Count(tokens);
    return inner_->Feed(slots, tokens);
  }
  StatusOr<SampledFeed> FeedAndSample(const std::vector<int>& slots,
                                      const std::vector<std::vector<int32_t>>& tokens,
                                      const std::vector<SlotDraw>& draws) override {
    Count(tokens);
    return inner_->FeedAndSample(slots, tokens, draws);
  }

  void EndStep() {
    max_step_tokens = std::max(max_step_tokens, step_tokens);
    mixed_steps += step_singles > 0 && step_longer > 0;
    step_tokens = step_singles = step_longer = 0;
  }
  int64_t tokens = 0, prefill_tokens = 0, max_step_tokens = 0, mixed_steps = 0;

 private:
  void Count(const std::vector<std::vector<int32_t>>& feeds) {
    for (const auto& t : feeds) {
      const auto n = static_cast<int64_t>(t.size());
      tokens += n;
      step_tokens += n;
      if (n > 1) {
        prefill_tokens += n;
        ++step_longer;
      } else {
        ++step_singles;
      }
    }
  }
  int64_t step_tokens = 0, step_singles = 0, step_longer = 0;
};

struct CalcFixture {
  Tokenizer tokenizer = Tokenizer::FromMerges(ChatSpecialTokens(), {});
  std::unique_ptr<ChatFormat> format;
  std::unique_ptr<env::Env> env;
  env::TaskRef task;
  calc::CalcTask calc_task;

  static calc::CalcEnvOptions Options() {
    calc::CalcEnvOptions o;
    o.seed = 3;
    o.difficulty = 2;
    return o;
  }
  CalcFixture() {
    format = std::make_unique<ChatFormat>(*ChatFormat::Create(&tokenizer));
    env = calc::MakeCalcEnv(Options());
    task = *env->Task(env::Split::kTrain, 4);
    calc_task = *calc::MakeCalcTask(3, env::Split::kTrain, 4, 2);
  }
  // The ids of an assistant turn as the chat format renders it, without the role header.
  std::vector<int32_t> TurnIds(const ChatMessage& m) {
    auto r = format->Render({m});
    return std::vector<int32_t>(r->ids.begin() + 1, r->ids.end());
  }
  ChatMessage ToolCallTurn() {
    ChatMessage m;
    m.role = ChatRole::kAssistant;
    m.tool_calls.push_back(
        {"call_0", "calculate", "{\"expression\": \"" + calc_task.expression + "\"}"});
    return m;
  }
  ChatMessage AnswerTurn(const std::string& value) {
    ChatMessage m;
    m.role = ChatRole::kAssistant;
    m.content = "Answer: " + value;
    return m;
  }
};

// The agent loop's runs compared: every trajectory's tokens equal, behaviour logprobs to `tol`
// (the same numbers computed along another schedule: a prompt prefilled in chunks, as a copy and
// a decode, or again after a preemption rounds differently: ~1e-6 relative in f32), and the R3
// experts equal but for near-ties flipped by that rounding (at most 1%).
inline void ExpectSameTrajectories(const std::vector<TrajectoryGroup>& a,
                                   const std::vector<TrajectoryGroup>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  int64_t routed = 0, differing = 0;
  for (size_t g = 0; g < a.size(); ++g) {
    ASSERT_EQ(a[g].group_id, b[g].group_id);
    ASSERT_EQ(a[g].trajectories.size(), b[g].trajectories.size());
    for (size_t e = 0; e < a[g].trajectories.size(); ++e) {
      const Trajectory& x = a[g].trajectories[e];
      const Trajectory& y = b[g].trajectories[e];
      ASSERT_EQ(x.tokens, y.tokens) << "group " << g << " episode " << e;
      EXPECT_EQ(x.status, y.status);
      EXPECT_GT(x.model_tokens(), 0);
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size());
      for (size_t i = 0; i < x.logprobs.size(); ++i) {
        EXPECT_NEAR(x.logprobs[i], y.logprobs[i], tol) << g << " " << e << " " << i;
      }
      ASSERT_EQ(x.routed_experts.size(), y.routed_experts.size());
      for (size_t i = 0; i < x.routed_experts.size(); ++i) {
        differing += x.routed_experts[i] != y.routed_experts[i];
      }
      routed += static_cast<int64_t>(x.routed_experts.size());
    }
  }
  EXPECT_LE(differing, routed / 100) << differing << " of " << routed << " routed experts differ";
}

// Groups of the calc environment's tasks through the agent loop on `backend`; every episode is
// checked to have ended whole (not an environment fault). `after_step` runs after each step.
template <typename AfterStep>
std::vector<TrajectoryGroup> RunAgent(PolicyBackend* backend, const CalcFixture& f,
                                      const AgentOptions& o, int tasks, int group_size,
                                      AgentStats* stats, AfterStep after_step) {
  AgentLoop loop(backend, f.format.get(), f.env.get(), o);
  for (int t = 0; t < tasks; ++t) {
    auto task = f.env->Task(env::Split::kTrain, static_cast<uint64_t>(4 + t));
    EXPECT_TRUE(task.ok());
    loop.AddGroup(*task, static_cast<uint64_t>(t), group_size);
  }
  std::vector<TrajectoryGroup> all;
  while (!loop.idle()) {
    auto groups = loop.Step();
    EXPECT_TRUE(groups.ok()) << groups.status().ToString();
    if (!groups.ok()) return {};
    for (auto& g : *groups) all.push_back(std::move(g));
    after_step();
  }
  std::sort(all.begin(), all.end(), [](const TrajectoryGroup& a, const TrajectoryGroup& b) {
    return a.group_id < b.group_id;
  });
  for (const auto& g : all) {
    for (const auto& t : g.trajectories) EXPECT_FALSE(t.env_fault()) << t.task_id;
  }
  *stats = loop.stats();
  return all;
}

}  // namespace orrery::rollout
