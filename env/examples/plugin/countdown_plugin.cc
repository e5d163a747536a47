// An example C++ environment plug-in: "countdown". The model must reach a target number from 0
// with the tools add(n) and double(); reward 1 when the counter equals the target at the end,
// minus 0.1 per call beyond the fewest possible. Build: a MODULE library linked against nothing
// but the C++ runtime (Orrery's symbols come from the host executable).
#include <nlohmann/json.hpp>

#include "env/env.h"
#include "env/plugin.h"
#include "env/tool_call.h"

namespace {

using namespace orrery;
using namespace orrery::env;

int FewestCalls(int64_t target) {
  int calls = 0;
  while (target > 0) {
    if (target % 2 == 0 && target > 1) {
      target /= 2;
    } else {
      target -= 1;
    }
    ++calls;
  }
  return calls;
}

class CountdownEpisode : public Episode {
 public:
  explicit CountdownEpisode(int64_t target) : target_(target) {
    messages_ = {ChatMessage{ChatRole::kUser,
                             "Starting from 0, reach exactly " + std::to_string(target) +
                                 " with add(n) (1 <= n <= 9) and double(). Use few calls.",
                             {},
                             "",
                             ""}};
    tools_ = {
        ToolSpec{
            "add", "add n to the counter",
            R"({"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":9}},"required":["n"],"additionalProperties":false})"},
        ToolSpec{"double", "double the counter",
                 R"({"type":"object","properties":{},"additionalProperties":false})"}};
  }
  const std::vector<ChatMessage>& initial_messages() const override { return messages_; }
  const std::vector<ToolSpec>& tools() const override { return tools_; }
  StatusOr<ToolResult> Step(const ToolCall& call, Deadline) override {
    StatusOr<std::string> args = ValidateToolCall(call, tools_);
    if (!args.ok()) return ToolError(args.status().message());
    ++calls_;
    if (call.name == "add") {
      counter_ += nlohmann::json::parse(*args)["n"].get<int64_t>();
    } else {
      counter_ *= 2;
    }
    return ToolResult{"counter = " + std::to_string(counter_), false, 0};
  }
  StatusOr<EpisodeScore> Score(const std::vector<ChatMessage>&, Deadline) override {
    EpisodeScore s;
    const double reached = counter_ == target_ ? 1.0 : 0.0;
    const int extra = std::max(0, calls_ - FewestCalls(target_));
    s.reward = std::max(0.0, reached - 0.1 * extra);
    s.components = {{"reached", reached}, {"calls", static_cast<double>(calls_)}};
    return s;
  }

 private:
  int64_t target_;
  int64_t counter_ = 0;
  int calls_ = 0;
  std::vector<ChatMessage> messages_;
  std::vector<ToolSpec> tools_;
};

class CountdownEnv : public Env {
 public:
  explicit CountdownEnv(int64_t max_target) : max_target_(max_target) {}
  std::string name() const override { return "countdown"; }
  StatusOr<TaskRef> Task(Split split, uint64_t index) const override {
    return TaskRef{"countdown/" + std::string(SplitName(split)) + "/" + std::to_string(index),
                   split, 0, index};
  }
  StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& task, Deadline) override {
    // Train targets are even, test targets odd: disjoint splits.
    const int64_t base =
        2 + static_cast<int64_t>((task.index * 7919) % static_cast<uint64_t>(max_target_));
    const int64_t target = (base & ~int64_t{1}) + (task.split == Split::kTest ? 1 : 0);
    return std::unique_ptr<Episode>(new CountdownEpisode(target));
  }

 private:
  int64_t max_target_;
};

}  // namespace

extern "C" int orrery_env_plugin_abi_version(void) { return ORRERY_ENV_PLUGIN_ABI; }

extern "C" int orrery_env_plugin_register_v1(orrery::env::EnvRegistry* registry) {
  Status s = registry->Register(
      "countdown", "example C++ plug-in: reach a target number with add and double",
      [](ConfigTable& options) -> StatusOr<std::unique_ptr<Env>> {
        return std::unique_ptr<Env>(
            std::make_unique<CountdownEnv>(options.Int("max_target", 1000, 2, 1 << 30)));
      });
  return s.ok() ? 0 : 1;
}
