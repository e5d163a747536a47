// The `run_isolated` request of orrery-env/1 (docs/env-protocol.md): an external environment asks
// Orrery to run code it must not run itself.
//
// An external environment's program runs with its directory at /env and its secrets (hidden
// tests, expected outputs) in its memory; code it executed there could read both. So while Orrery
// waits for the program's reply to a call (reset, step or score), the program may send Orrery a
// request of its own,
//   {"jsonrpc": "2.0", "id": "r1", "method": "run_isolated",
//    "params": {"files": {"solution.py": "..."}, "argv": ["/usr/bin/python3", "solution.py"],
//               "inputs": ["1 2\n", "3 4\n"], "seconds_each": 5}}
// and Orrery runs argv once per input in a sandbox of its own that holds only `files`
// (RunIsolated, env/sandbox/isolated_grading.h: no /env, no view of the program), then answers
//   {"jsonrpc": "2.0", "id": "r1", "result": {"runs": [{"exit_code": 0, "signal": 0,
//    "timed_out": false, "limit_exceeded": "", "output_truncated": false, "stdout": "3\n",
//    "stderr": "", "wall_seconds": 0.04, "status": "exit 0"}, ...]}}
// The program compares the outputs with what it expects, in its own memory. These are the parser
// of the params and the writer of the result; ExternalEnv serves the request.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "env/sandbox/isolated_grading.h"

namespace orrery::env {

inline constexpr const char* kRunIsolatedMethod = "run_isolated";
inline constexpr size_t kRunIsolatedMaxInputs = 256;
inline constexpr size_t kRunIsolatedMaxFiles = 64;

struct RunIsolatedRequest {
  IsolatedProgram program;
  std::vector<std::string> inputs;
};

// Parses the request's params (JSON text from the program; never throws). InvalidArgument naming
// the field: files must be an object of relative paths to strings (at most kRunIsolatedMaxFiles),
// argv a non-empty array of strings, inputs an array of at most kRunIsolatedMaxInputs strings
// (default: one empty input), seconds_each a number in (0, max_seconds] (default 5, cut to
// max_seconds).
StatusOr<RunIsolatedRequest> ReadRunIsolatedParams(const std::string& params_json,
                                                   double max_seconds);

// The result object, {"runs": [...]}, as JSON text (invalid UTF-8 of the outputs becomes U+FFFD).
std::string RunIsolatedResultJson(const std::vector<RunResult>& runs);

}  // namespace orrery::env
