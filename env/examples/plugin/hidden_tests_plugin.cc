// An example C++ plug-in that grades code the model writes without letting that code read the
// hidden tests: "hidden_tests". The model writes a Python program over numbers on stdin (the
// problems of env/examples/grade_env_tests.json, whose path is the `tests_file` option); its final
// assistant message carries the program in a ```python block, and the reward is the fraction of
// hidden tests passed. The tests file is on the host, in this plug-in's directory; the program runs
// through GradeIsolated (env/sandbox/isolated_grading.h) in a sandbox that binds none of it, and
// its outputs are compared here. A solution that goes looking for the tests finds nothing.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "env/env.h"
#include "env/plugin.h"
#include "env/python/python_env.h"
#include "env/sandbox/isolated_grading.h"
#include "env/sandbox/sandbox_pool.h"
#include "env/tool_call.h"

namespace {

using namespace orrery;
using namespace orrery::env;

struct Problem {
  std::string statement;
  std::vector<GradeCase> tests;
};

class HiddenTestsEpisode : public Episode {
 public:
  HiddenTestsEpisode(const Problem& problem, std::unique_ptr<PooledSandbox> sandbox)
      : problem_(problem), sandbox_(std::move(sandbox)) {
    messages_ = {ChatMessage{ChatRole::kUser, problem_.statement, {}, "", ""}};
  }
  const std::vector<ChatMessage>& initial_messages() const override { return messages_; }
  const std::vector<ToolSpec>& tools() const override { return tools_; }
  StatusOr<ToolResult> Step(const ToolCall& call, Deadline) override {
    return ToolError("unknown tool '" + call.name + "'");
  }
  StatusOr<EpisodeScore> Score(const std::vector<ChatMessage>& trajectory,
                               Deadline deadline) override {
    EpisodeScore score;
    score.components = {{"tests_passed", 0},
                        {"tests_total", static_cast<double>(problem_.tests.size())}};
    const ChatMessage* last = nullptr;
    for (const ChatMessage& m : trajectory) {
      if (m.role == ChatRole::kAssistant) last = &m;
    }
    const std::optional<std::string> code = last ? LastPythonBlock(last->content) : std::nullopt;
    if (!code) return score;
    const IsolatedProgram program{
        {{"solution.py", *code}}, {"/usr/bin/python3", "-I", "solution.py"}, 5};
    ORRERY_ASSIGN_OR_RETURN(Grade grade,
                            GradeIsolated(**sandbox_, program, problem_.tests, deadline));
    score.components["tests_passed"] = grade.num_passed;
    score.reward = grade.fraction();
    return score;
  }

 private:
  const Problem problem_;  // a copy: the episode does not depend on the Env's lifetime
  std::unique_ptr<PooledSandbox> sandbox_;
  std::vector<ChatMessage> messages_;
  std::vector<ToolSpec> tools_;
};

class HiddenTestsEnv : public Env {
 public:
  HiddenTestsEnv(std::vector<Problem> problems, int pool_size)
      : problems_(std::move(problems)),
        // No binds: the sandbox holds the solution and nothing else. Slots 1024 and up: the
        // python environment's pool starts at 0 (docs/env.md, "Sandbox pools").
        pool_(IsolatedSandboxOptions(SandboxOptions{}), pool_size, 1024) {}
  std::string name() const override { return "hidden_tests"; }
  StatusOr<TaskRef> Task(Split split, uint64_t index) const override {
    return TaskRef{"hidden_tests/" + std::string(SplitName(split)) + "/" + std::to_string(index),
                   split, 0, index};
  }
  StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& task, Deadline deadline) override {
    // Disjoint splits: train asks for the even-numbered problems, test for the odd-numbered ones.
    const size_t i = (2 * task.index + (task.split == Split::kTest ? 1 : 0)) % problems_.size();
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<PooledSandbox> sandbox, pool_.Acquire(deadline));
    return std::unique_ptr<Episode>(new HiddenTestsEpisode(problems_[i], std::move(sandbox)));
  }

 private:
  std::vector<Problem> problems_;
  SandboxPool pool_;
};

// {"name": {"statement": "...", "tests": [[input, expected], ...]}, ...}, in name order.
StatusOr<std::vector<Problem>> ReadProblems(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (!in || j.is_discarded() || !j.is_object() || j.empty()) {
    return InvalidArgumentError(path + ": expected a JSON object of problems");
  }
  std::vector<Problem> problems;
  for (const auto& [name, p] : j.items()) {
    if (!p.is_object() || !p.contains("statement") || !p["statement"].is_string() ||
        !p.contains("tests") || !p["tests"].is_array() || p["tests"].empty()) {
      return InvalidArgumentError(path + ": problem '" + name +
                                  "': expected a string 'statement' and a non-empty 'tests'");
    }
    Problem problem{p["statement"].get<std::string>(), {}};
    for (const nlohmann::json& t : p["tests"]) {
      if (!t.is_array() || t.size() != 2 || !t[0].is_string() || !t[1].is_string()) {
        return InvalidArgumentError(path + ": problem '" + name +
                                    "': each test is [input, expected output] (strings)");
      }
      problem.tests.push_back({t[0].get<std::string>(), t[1].get<std::string>()});
    }
    problems.push_back(std::move(problem));
  }
  return problems;
}

}  // namespace

extern "C" int orrery_env_plugin_abi_version(void) { return ORRERY_ENV_PLUGIN_ABI; }

extern "C" int orrery_env_plugin_register_v1(orrery::env::EnvRegistry* registry) {
  Status s = registry->RegisterSized(
      "hidden_tests", "example C++ plug-in: a program over stdin, graded where it cannot look",
      [](ConfigTable& options, const EnvDemand& demand) -> StatusOr<std::unique_ptr<Env>> {
        const std::string path = options.Path("tests_file", "");
        const int pool_size = ReadPoolSize(options, demand, 1024);
        if (path.empty()) return InvalidArgumentError("hidden_tests: set tests_file");
        ORRERY_ASSIGN_OR_RETURN(std::vector<Problem> problems, ReadProblems(path));
        return std::unique_ptr<Env>(
            std::make_unique<HiddenTestsEnv>(std::move(problems), pool_size));
      });
  return s.ok() ? 0 : 1;
}
