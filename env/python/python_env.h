// The python environment: coding tasks with hidden unit tests.
//
// The model has one tool, run_python(code), which runs /usr/bin/python3 on the code inside the
// episode's sandbox (files in /work persist across calls within an episode). Its final answer
// carries the solution in a ```python block; Score() empties the sandbox, writes the last such
// block to /work/solution.py and runs one sandboxed process per hidden test (run_each.h): the
// test's arguments go in on stdin, the function's result comes out as JSON, and Orrery compares it
// with the expected value in its own process. The expected outputs never enter the sandbox, so
// the code under grading cannot read them. Reward = fraction of hidden tests passed. Components:
// "tests_passed", "tests_total", "run_python_calls".
//
// Options ([env.python]): seed, wall_seconds, cpu_seconds, memory_mb, pool_size (default: the
// episodes in flight, see EnvDemand).
#pragma once

#include <memory>

#include "core/config.h"
#include "env/env.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

struct PythonEnvOptions {
  uint64_t seed = 0;
  SandboxOptions sandbox;  // limits of each run_python call and of grading
  int pool_size = 16;      // sandboxes kept for reuse (episodes in flight at most)
};

PythonEnvOptions ReadPythonEnvOptions(ConfigTable& table, const EnvDemand& demand);
std::unique_ptr<Env> MakePythonEnv(const PythonEnvOptions& options);

// The source of the last ```python (or plain ```) fenced block in `text`, if any.
std::optional<std::string> LastPythonBlock(const std::string& text);

}  // namespace orrery::env
