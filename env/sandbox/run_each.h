// Grading that the graded code cannot read: run untrusted code once per input, compare outside.
//
// A grader that runs next to the code it grades (hidden tests in a mounted file, expected outputs
// in its memory or environment) can be read by that code: a solution that opens the tests file
// returns the expected outputs and scores full marks. The pattern every built-in environment
// follows, and the one a plug-in should follow:
//   1. write the code to grade into a sandbox that holds nothing secret (no test files, no binds
//      of the environment's own directory, no expected values in its argv or environment);
//   2. RunEach(): one sandboxed run per test input, the input on stdin, so a run sees its own
//      input and nothing else, and no state survives from one test to the next (each run is a
//      fresh pid namespace and /tmp; the work dir keeps only what the caller wrote);
//   3. compare each run's stdout with the expected output in the caller's own process.
// The expected outputs never cross into the sandbox, so no code in it can read them; all it can
// do to "cheat" is compute the answers.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

// Runs `argv` in `sandbox` once per entry of `inputs` (given on stdin), each bounded by
// `seconds_each`, the sandbox's limits and `deadline`; returns the results in input order. A run
// that fails or times out is a RunResult; a Status error means the sandbox itself failed (or the
// deadline passed before every input ran: DeadlineExceeded).
StatusOr<std::vector<RunResult>> RunEach(Sandbox& sandbox, const std::vector<std::string>& argv,
                                         const std::vector<std::string>& inputs,
                                         double seconds_each, Deadline deadline);

}  // namespace orrery::env
