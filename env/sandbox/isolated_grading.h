// The helper for grading that the graded code cannot read (docs/env.md "Grading in a plug-in").
//
// What a grader keeps secret (hidden tests, expected outputs) must not be where the code it grades
// runs: a solution that can open the tests file, read the grader's memory or its environment
// returns the expected outputs and scores full marks. These functions run the code under test in a
// sandbox that holds nothing but that code:
//   - the sandbox must have no extra binds and no extra environment variables (a plug-in's data
//     directory, an external environment's /env): RunIsolated refuses one that has any;
//   - its work dir is emptied and gets only the program's files;
//   - each input is one run of its own (RunEach, run_each.h): a fresh pid namespace and /tmp, the
//     input on stdin, nothing else;
//   - what crosses back is each run's stdout, stderr and exit status (RunResult), and the
//     comparison with the expected output happens in the caller's process (GradeIsolated).
// The built-in python environment grades this way; C++ plug-ins call these functions directly,
// external (orrery-env/1) environments through the `run_isolated` request (docs/env-protocol.md),
// which Orrery serves with RunIsolated.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

// The code under test: files written into the empty /work, then argv run once per input.
struct IsolatedProgram {
  std::vector<std::pair<std::string, std::string>> files;  // relative path in /work -> contents
  std::vector<std::string> argv;
  double seconds_each = 5;  // wall-clock limit of each run (the sandbox's limits bound it too)
};

// `options` fit for RunIsolated: the same limits, bwrap and host uids, without extra binds or
// environment variables.
SandboxOptions IsolatedSandboxOptions(SandboxOptions options);

// Empties `sandbox`'s work dir, writes program.files into it and runs program.argv once per input
// (given on stdin), in input order. FailedPrecondition when the sandbox has extra binds or
// environment variables; InvalidArgument for an empty argv or a file path outside /work; a run
// that fails or times out is a RunResult.
StatusOr<std::vector<RunResult>> RunIsolated(Sandbox& sandbox, const IsolatedProgram& program,
                                             const std::vector<std::string>& inputs,
                                             Deadline deadline);

// One hidden test: the input the program reads, and the output the grader expects (never sent).
struct GradeCase {
  std::string input;
  std::string expected;
};

// Whether a run passed; called in the grader's process.
using OutputCheck = std::function<bool(const RunResult& run, const std::string& expected)>;

// Exit status 0 and stdout equal to `expected`, trailing whitespace of both ignored.
bool ExitZeroAndSameStdout(const RunResult& run, const std::string& expected);

struct Grade {
  std::vector<RunResult> runs;  // one per case, in order
  std::vector<bool> passed;     // one per case
  int num_passed = 0;
  // num_passed / cases (0 for no cases).
  double fraction() const;
};

// RunIsolated on the cases' inputs, then `check` of each run against its expected output, here.
StatusOr<Grade> GradeIsolated(Sandbox& sandbox, const IsolatedProgram& program,
                              const std::vector<GradeCase>& cases, Deadline deadline,
                              const OutputCheck& check = ExitZeroAndSameStdout);

}  // namespace orrery::env
