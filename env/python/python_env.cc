#include "env/python/python_env.h"

#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "env/python/problems.h"
#include "env/sandbox/isolated_grading.h"
#include "env/sandbox/sandbox_pool.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

// One hidden test, inside the sandbox: python3 -I -c kRunner FUNCTION < args. It sees the test's
// arguments and nothing else; the last line it prints is the result as JSON, which Orrery
// compares with the expected value outside the sandbox (run_each.h).
constexpr const char* kRunner = R"PY(import json, sys
sys.path.insert(0, '/work')
function = sys.argv[1]
args = json.loads(sys.stdin.read())
result = getattr(__import__('solution'), function)(*args)
print('\n' + json.dumps(result))
)PY";

// The last non-empty line of `text`.
std::string_view LastLine(std::string_view text) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  const size_t nl = text.rfind('\n');
  return nl == std::string_view::npos ? text : text.substr(nl + 1);
}

// A passing run exits 0 and prints the expected value as JSON on its last line.
bool SameJsonOnTheLastLine(const RunResult& run, const std::string& expected) {
  if (run.exit_code != 0) return false;
  const nlohmann::json got = ParseUntrustedJson(LastLine(run.stdout_text));
  return !got.is_discarded() && got == nlohmann::json::parse(expected);
}

// Seconds each hidden test may run.
constexpr double kTestSeconds = 5;

constexpr const char* kRunPythonSchema =
    R"({"type":"object","properties":{"code":{"type":"string","description":"Python 3 source to run with /usr/bin/python3 in /work","maxLength":100000}},"required":["code"],"additionalProperties":false})";

std::string ResultText(const RunResult& r) {
  std::string out = r.stdout_text;
  if (!r.stderr_text.empty())
    out += (out.empty() ? "" : "\n") + std::string("[stderr]\n") + r.stderr_text;
  if (r.output_truncated) out += "\n[output truncated]";
  out += "\n[" + r.Describe() + "]";
  return out;
}

class PythonEpisode : public Episode {
 public:
  PythonEpisode(CodingTask task, std::unique_ptr<PooledSandbox> sandbox)
      : task_(std::move(task)), sandbox_(std::move(sandbox)) {
    ChatMessage system{ChatRole::kSystem,
                       "You are a careful Python programmer. You can run code with the "
                       "run_python tool.",
                       {},
                       "",
                       ""};
    messages_ = {system, ChatMessage{ChatRole::kUser, task_.statement, {}, "", ""}};
    tools_ = {ToolSpec{"run_python",
                       "Run Python 3 code in a sandbox (no network; files in /work persist "
                       "during the episode). Returns stdout, stderr and the exit status.",
                       kRunPythonSchema}};
  }
  const std::vector<ChatMessage>& initial_messages() const override { return messages_; }
  const std::vector<ToolSpec>& tools() const override { return tools_; }

  StatusOr<ToolResult> Step(const ToolCall& call, Deadline deadline) override {
    const auto start = Clock::now();
    ++calls_;
    StatusOr<std::string> args = ValidateToolCall(call, tools_);
    if (!args.ok()) return ToolError(args.status().message());
    const std::string code = nlohmann::json::parse(*args)["code"].get<std::string>();
    ORRERY_RETURN_IF_ERROR((*sandbox_)->WriteFile("main.py", code));
    ORRERY_ASSIGN_OR_RETURN(RunResult r,
                            (*sandbox_)->Run({"/usr/bin/python3", "main.py"}, "", deadline));
    ToolResult result;
    result.content = ResultText(r);
    result.is_error = r.exit_code != 0;
    result.latency_s = std::chrono::duration<double>(Clock::now() - start).count();
    return result;
  }

  StatusOr<EpisodeScore> Score(const std::vector<ChatMessage>& trajectory,
                               Deadline deadline) override {
    EpisodeScore score;
    score.components["tests_total"] = task_.num_tests;
    score.components["tests_passed"] = 0;
    score.components["run_python_calls"] = calls_;
    const ChatMessage* last = nullptr;
    for (const ChatMessage& m : trajectory) {
      if (m.role == ChatRole::kAssistant) last = &m;
    }
    std::optional<std::string> solution = last ? LastPythonBlock(last->content) : std::nullopt;
    if (!solution) return score;
    // The hidden tests stay in this process: the sandbox gets the solution and one test's
    // arguments per run, and the results are compared here (isolated_grading.h).
    const nlohmann::json tests = nlohmann::json::parse(task_.tests_json);
    std::vector<GradeCase> cases;
    for (const nlohmann::json& test : tests) cases.push_back({test[0].dump(), test[1].dump()});
    const IsolatedProgram program{{{"solution.py", *solution}},
                                  {"/usr/bin/python3", "-I", "-c", kRunner, task_.function},
                                  kTestSeconds};
    ORRERY_ASSIGN_OR_RETURN(
        Grade grade, GradeIsolated(**sandbox_, program, cases, deadline, SameJsonOnTheLastLine));
    const int passed = grade.num_passed;
    score.components["tests_passed"] = passed;
    score.reward = task_.num_tests > 0 ? static_cast<double>(passed) / task_.num_tests : 0.0;
    return score;
  }

 private:
  CodingTask task_;
  std::unique_ptr<PooledSandbox> sandbox_;
  std::vector<ChatMessage> messages_;
  std::vector<ToolSpec> tools_;
  int calls_ = 0;
};

class PythonEnv : public Env {
 public:
  explicit PythonEnv(const PythonEnvOptions& options)
      : options_(options), pool_(options.sandbox, options.pool_size, /*first_slot=*/0) {}
  std::string name() const override { return "python"; }

  StatusOr<TaskRef> Task(Split split, uint64_t index) const override {
    ORRERY_ASSIGN_OR_RETURN(CodingTask t, MakeCodingTask(options_.seed, split, index));
    return TaskRef{t.id, split, options_.seed, index};
  }

  StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& ref, Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(CodingTask task, MakeCodingTask(ref.seed, ref.split, ref.index));
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<PooledSandbox> sandbox, pool_.Acquire(deadline));
    return std::unique_ptr<Episode>(new PythonEpisode(std::move(task), std::move(sandbox)));
  }

 private:
  PythonEnvOptions options_;
  SandboxPool pool_;
};

}  // namespace

std::optional<std::string> LastPythonBlock(const std::string& text) {
  std::optional<std::string> found;
  size_t pos = 0;
  for (;;) {
    const size_t open = text.find("```", pos);
    if (open == std::string::npos) break;
    const size_t line_end = text.find('\n', open);
    if (line_end == std::string::npos) break;
    const std::string lang = text.substr(open + 3, line_end - open - 3);
    const size_t close = text.find("```", line_end + 1);
    if (close == std::string::npos) break;
    if (lang == "python" || lang == "py" || lang.empty()) {
      found = text.substr(line_end + 1, close - line_end - 1);
    }
    pos = close + 3;
  }
  return found;
}

PythonEnvOptions ReadPythonEnvOptions(ConfigTable& table, const EnvDemand& demand) {
  PythonEnvOptions o;
  o.seed = static_cast<uint64_t>(table.Int("seed", 0, 0));
  o.sandbox.limits.wall_seconds = table.Float("wall_seconds", 20, 0.1, 3600);
  o.sandbox.limits.cpu_seconds = table.Int("cpu_seconds", 10, 1, 3600);
  o.sandbox.limits.address_space_bytes = table.Int("memory_mb", 1024, 64, 1 << 20) << 20;
  o.pool_size = ReadPoolSize(table, demand, 2047);
  return o;
}

std::unique_ptr<Env> MakePythonEnv(const PythonEnvOptions& options) {
  return std::make_unique<PythonEnv>(options);
}

}  // namespace orrery::env
