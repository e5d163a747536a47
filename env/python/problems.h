// The coding problems of the python environment: a statement, a function name and hidden tests.
//
// Each problem family has a C++ reference that computes the expected outputs, so tests are
// generated, not stored. A task is a pure function of (seed, split, index): the family is
// index % families, the constants and the hidden test inputs come from a Philox stream of
// (seed, split, index). Train and test tasks of one family share the statement shape but differ
// in constants and hidden inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/split.h"

namespace orrery::env {

struct CodingTask {
  std::string id;         // "python/train/<family>/<seed>/<index>"
  std::string function;   // the function the solution must define
  std::string statement;  // the user message
  // Hidden tests: a JSON array of [args (JSON array), expected (JSON value)] pairs.
  std::string tests_json;
  int num_tests = 0;
};

int NumCodingFamilies();
StatusOr<CodingTask> MakeCodingTask(uint64_t seed, Split split, uint64_t index);

// The reference solution of a task in Python (for tests and for `env try` demonstrations).
std::string ReferenceSolution(const CodingTask& task);

}  // namespace orrery::env
