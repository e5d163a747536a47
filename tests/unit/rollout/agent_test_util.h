// Test doubles for the agent loop: a scripted policy backend and the calc environment with a
// tokenizer, chat format and one task (shared by the rollout and remote-environment tests).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "env/calc/calc_env.h"
#include "env/calc/prompt.h"
#include "env/calc/task.h"
#include "model/chat_format.h"
#include "rollout/policy_backend.h"

namespace orrery::rollout {

// A test double: for every feed, puts all the mass on the next token of its slot's script.
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
      const int32_t next = script[std::min<size_t>(cursor_[s]++, script.size() - 1)];
      r.logits.data<float>()[i * vocab_ + next] = 100.0f;
    }
    return r;
  }
  void Release(int slot) override {
    cursor_[slot] = 0;
    owner_[slot] = -1;
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

}  // namespace orrery::rollout
