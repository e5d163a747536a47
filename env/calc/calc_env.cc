#include "env/calc/calc_env.h"

#include <nlohmann/json.hpp>

#include "env/calc/answer.h"
#include "env/calc/expression.h"
#include "env/calc/one_operation.h"
#include "env/calc/prompt.h"
#include "env/calc/task.h"
#include "env/tool_call.h"

namespace orrery::calc {
namespace {

using env::Deadline;
using env::ToolResult;

env::ToolSpec CalculateSpec(CalcTool tool) {
  const nlohmann::json j = nlohmann::json::parse(CalculateToolSpecJson(tool));
  return env::ToolSpec{kCalculateTool, j["function"]["description"].get<std::string>(),
                       j["function"]["parameters"].dump()};
}

class CalcEpisode : public env::Episode {
 public:
  CalcEpisode(CalcTask task, int max_tool_calls, CalcTool tool)
      : task_(std::move(task)),
        messages_(CalcInitialMessages(task_, tool)),
        tools_{CalculateSpec(tool)},
        max_tool_calls_(max_tool_calls),
        tool_(tool) {}

  const std::vector<ChatMessage>& initial_messages() const override { return messages_; }
  const std::vector<env::ToolSpec>& tools() const override { return tools_; }

  StatusOr<ToolResult> Step(const ToolCall& call, Deadline) override {
    const auto start = env::Clock::now();
    ToolResult result = Run(call);
    result.latency_s = std::chrono::duration<double>(env::Clock::now() - start).count();
    return result;
  }

  StatusOr<env::EpisodeScore> Score(const std::vector<ChatMessage>& trajectory, Deadline) override {
    env::EpisodeScore score;
    const ChatMessage* last = nullptr;
    double tool_calls = 0;
    for (const ChatMessage& m : trajectory) {
      if (m.role != ChatRole::kAssistant) continue;
      last = &m;
      tool_calls += static_cast<double>(m.tool_calls.size());
    }
    score.reward = last ? ScoreCalcAnswer(last->content, task_.answer) : 0.0;
    score.components["correct"] = score.reward;
    score.components["tool_calls"] = tool_calls;
    return score;
  }

 private:
  ToolResult Run(const ToolCall& call) {
    if (++calls_ > max_tool_calls_) {
      return env::ToolError("tool call budget of " + std::to_string(max_tool_calls_) +
                            " calls is used up; give your answer");
    }
    StatusOr<std::string> args = env::ValidateToolCall(call, tools_);
    if (!args.ok()) return env::ToolError(args.status().message());
    const std::string expression = nlohmann::json::parse(*args)["expression"].get<std::string>();
    StatusOr<Rational> value = tool_ == CalcTool::kOneOperation ? EvaluateOneOperation(expression)
                                                                : EvaluateExpression(expression);
    if (!value.ok()) return env::ToolError(value.status().message());
    ToolResult r;
    r.content = value->ToString();
    return r;
  }

  CalcTask task_;
  std::vector<ChatMessage> messages_;
  std::vector<env::ToolSpec> tools_;
  int max_tool_calls_;
  CalcTool tool_;
  int calls_ = 0;
};

class CalcEnv : public env::Env {
 public:
  explicit CalcEnv(const CalcEnvOptions& options) : options_(options) {}
  std::string name() const override { return "calc"; }

  StatusOr<env::TaskRef> Task(env::Split split, uint64_t index) const override {
    ORRERY_ASSIGN_OR_RETURN(CalcTask task, Make(split, index));
    return env::TaskRef{task.id, split, options_.seed, index};
  }

  std::string Family(const env::TaskRef& task) const override {
    return "calc/d" + std::to_string(Difficulty(task.index));
  }

  StatusOr<std::unique_ptr<env::Episode>> Reset(const env::TaskRef& ref, Deadline) override {
    ORRERY_ASSIGN_OR_RETURN(CalcTask task,
                            MakeCalcTask(ref.seed, ref.split, ref.index, Difficulty(ref.index)));
    return std::unique_ptr<env::Episode>(
        std::make_unique<CalcEpisode>(std::move(task), options_.max_tool_calls, options_.tool));
  }

 private:
  int Difficulty(uint64_t index) const {
    if (!options_.difficulties.empty()) {
      // A hash of the index, not index % n: rollout instance i of N takes tasks i, i + N, ...,
      // which a modulus would give one difficulty only when N and n share a factor.
      uint64_t z = index + 0x9e3779b97f4a7c15ull;  // splitmix64's finaliser
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return options_.difficulties[(z ^ (z >> 31)) % options_.difficulties.size()];
    }
    return options_.difficulty != 0 ? options_.difficulty
                                    : kMinDifficulty + static_cast<int>(index % kMaxDifficulty);
  }
  StatusOr<CalcTask> Make(env::Split split, uint64_t index) const {
    return MakeCalcTask(options_.seed, split, index, Difficulty(index));
  }

  CalcEnvOptions options_;
};

}  // namespace

CalcEnvOptions ReadCalcEnvOptions(ConfigTable& table) {
  CalcEnvOptions o;
  o.seed = static_cast<uint64_t>(table.Int("seed", 0, 0));
  o.difficulty = static_cast<int>(table.Int("difficulty", 0, 0, kMaxDifficulty));
  for (int64_t d : table.IntList("difficulties", {}, kMinDifficulty, kMaxDifficulty)) {
    o.difficulties.push_back(static_cast<int>(d));
  }
  if (!o.difficulties.empty() && o.difficulty != 0) {
    table.Fail("difficulties", "is a mix of difficulties: leave difficulty out (or 0) with it");
  }
  o.max_tool_calls = static_cast<int>(table.Int("max_tool_calls", 16, 1, 1000));
  o.tool = table.Enum("tool", "expression", {"expression", "one_operation"}) == "one_operation"
               ? CalcTool::kOneOperation
               : CalcTool::kExpression;
  return o;
}

std::unique_ptr<env::Env> MakeCalcEnv(const CalcEnvOptions& options) {
  return std::make_unique<CalcEnv>(options);
}

}  // namespace orrery::calc
