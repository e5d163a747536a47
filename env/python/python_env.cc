#include "env/python/python_env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "env/digest.h"
#include "env/python/problems.h"
#include "env/sandbox/sandbox_pool.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

namespace fs = std::filesystem;

// Runs inside the sandbox: python3 -I /grader/grader.py FUNCTION < nonce. Each test runs the
// solution in a child process (so a solution cannot patch the grader's comparison), and the grader
// turns itself non-dumpable so same-uid children cannot read its memory through /proc.
constexpr const char* kGrader = R"PY(import ctypes, json, subprocess, sys
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
nonce = sys.stdin.readline().strip()
function = sys.argv[1]
tests = json.load(open('/grader/tests.json'))
runner = ('import json, sys\nsys.path.insert(0, "/work")\nfrom solution import ' + function +
          '\nargs = json.loads(sys.stdin.read())\nprint("\\n" + json.dumps(' + function + '(*args)))')
passed = 0
for args, expected in tests:
    try:
        r = subprocess.run([sys.executable, '-I', '-c', runner], input=json.dumps(args),
                           capture_output=True, text=True, timeout=5)
        lines = r.stdout.strip().split('\n')
        if r.returncode == 0 and lines and json.loads(lines[-1]) == expected:
            passed += 1
    except Exception:
        pass
print('ORRERY-GRADE', nonce, passed, len(tests))
)PY";

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
  PythonEpisode(CodingTask task, std::unique_ptr<PooledSandbox> sandbox, std::string grader_dir,
                std::map<std::string, std::string> hashes)
      : task_(std::move(task)),
        sandbox_(std::move(sandbox)),
        grader_dir_(std::move(grader_dir)),
        hashes_(std::move(hashes)) {
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
  ~PythonEpisode() override {
    std::error_code ec;
    fs::remove_all(grader_dir_, ec);
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
    score.components["tampered"] = 0;
    const ChatMessage* last = nullptr;
    for (const ChatMessage& m : trajectory) {
      if (m.role == ChatRole::kAssistant) last = &m;
    }
    std::optional<std::string> solution = last ? LastPythonBlock(last->content) : std::nullopt;
    for (const auto& [file, hash] : hashes_) {
      StatusOr<std::string> now = Sha256File(grader_dir_ + "/" + file);
      if (!now.ok() || *now != hash) {
        score.components["tampered"] = 1;
        return score;
      }
    }
    if (!solution) return score;
    ORRERY_RETURN_IF_ERROR((*sandbox_)->Reset());
    ORRERY_RETURN_IF_ERROR((*sandbox_)->WriteFile("solution.py", *solution));
    std::random_device rd;
    const std::string nonce = std::to_string(rd()) + std::to_string(rd());
    // The grader and the hidden tests are mounted for grading only: run_python never sees them.
    (*sandbox_)->set_ro_binds({{grader_dir_, "/grader"}});
    StatusOr<RunResult> graded = (*sandbox_)->Run(
        {"/usr/bin/python3", "-I", "/grader/grader.py", task_.function}, nonce + "\n", deadline);
    (*sandbox_)->set_ro_binds({});
    ORRERY_ASSIGN_OR_RETURN(RunResult r, std::move(graded));
    // The grader's last line: "ORRERY-GRADE <nonce> <passed> <total>".
    const std::string tag = "ORRERY-GRADE " + nonce + " ";
    const size_t at = r.stdout_text.rfind(tag);
    if (at == std::string::npos) {
      if (r.timed_out) return DeadlineExceededError("python env: grading timed out");
      return score;  // the grader died: nothing passed
    }
    int passed = 0, total = 0;
    if (std::sscanf(r.stdout_text.c_str() + at + tag.size(), "%d %d", &passed, &total) != 2 ||
        total != task_.num_tests) {
      return InternalError("python env: malformed grader output");
    }
    score.components["tests_passed"] = passed;
    score.reward = total > 0 ? static_cast<double>(passed) / total : 0.0;
    return score;
  }

 private:
  CodingTask task_;
  std::unique_ptr<PooledSandbox> sandbox_;
  std::string grader_dir_;
  std::map<std::string, std::string> hashes_;
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
    // The grader dir belongs to Orrery's uid (0755/0644): readable, never writable, inside.
    std::string dir = options_.sandbox.scratch_root + "/orrery-grader-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) return ErrnoError("python env: mkdtemp", errno);
    chmod(dir.c_str(), 0755);
    std::map<std::string, std::string> hashes;
    for (const auto& [file, contents] : {std::pair<std::string, std::string>{"grader.py", kGrader},
                                         {"tests.json", task.tests_json}}) {
      const std::string path = dir + "/" + file;
      FILE* f = std::fopen(path.c_str(), "w");
      if (f == nullptr) return ErrnoError("python env: write " + path, errno);
      std::fwrite(contents.data(), 1, contents.size(), f);
      std::fclose(f);
      chmod(path.c_str(), 0644);
      hashes[file] = Sha256Hex(contents);
    }
    StatusOr<std::unique_ptr<PooledSandbox>> sandbox = pool_.Acquire(deadline);
    if (!sandbox.ok()) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      return sandbox.status();
    }
    return std::unique_ptr<Episode>(
        new PythonEpisode(std::move(task), std::move(*sandbox), dir, std::move(hashes)));
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
