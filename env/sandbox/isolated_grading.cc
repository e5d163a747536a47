#include "env/sandbox/isolated_grading.h"

#include <string_view>

#include "env/sandbox/run_each.h"

namespace orrery::env {
namespace {

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

SandboxOptions IsolatedSandboxOptions(SandboxOptions options) {
  options.ro_binds.clear();
  options.env.clear();
  return options;
}

StatusOr<std::vector<RunResult>> RunIsolated(Sandbox& sandbox, const IsolatedProgram& program,
                                             const std::vector<std::string>& inputs,
                                             Deadline deadline) {
  if (!sandbox.options().ro_binds.empty() || !sandbox.options().env.empty()) {
    return FailedPreconditionError(
        "isolated run: the sandbox has " + std::to_string(sandbox.options().ro_binds.size()) +
        " extra bind(s) and " + std::to_string(sandbox.options().env.size()) +
        " extra environment variable(s); a sandbox that runs code under test must hold nothing "
        "but that code (IsolatedSandboxOptions)");
  }
  if (program.argv.empty()) return InvalidArgumentError("isolated run: empty argv");
  ORRERY_RETURN_IF_ERROR(sandbox.Reset());
  for (const auto& [path, contents] : program.files) {
    ORRERY_RETURN_IF_ERROR(sandbox.WriteFile(path, contents));
  }
  return RunEach(sandbox, program.argv, inputs, program.seconds_each, deadline);
}

bool ExitZeroAndSameStdout(const RunResult& run, const std::string& expected) {
  return run.exit_code == 0 && TrimRight(run.stdout_text) == TrimRight(expected);
}

double Grade::fraction() const {
  return passed.empty() ? 0.0 : static_cast<double>(num_passed) / passed.size();
}

StatusOr<Grade> GradeIsolated(Sandbox& sandbox, const IsolatedProgram& program,
                              const std::vector<GradeCase>& cases, Deadline deadline,
                              const OutputCheck& check) {
  std::vector<std::string> inputs;
  inputs.reserve(cases.size());
  for (const GradeCase& c : cases) inputs.push_back(c.input);
  Grade grade;
  ORRERY_ASSIGN_OR_RETURN(grade.runs, RunIsolated(sandbox, program, inputs, deadline));
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool ok = check(grade.runs[i], cases[i].expected);
    grade.passed.push_back(ok);
    grade.num_passed += ok;
  }
  return grade;
}

}  // namespace orrery::env
