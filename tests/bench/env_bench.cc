// Environment benchmarks: step latency (p50/p99) of calc and of sandboxed python, grading one
// python solution, and sandbox start-up cold (a new Sandbox: work dir + seccomp filter + first
// process) and pooled (a reused Sandbox from a SandboxPool + one process). Figures go to
// docs/benchmarks.md.
//
//   build-env/tests/env_bench --benchmark_min_time=2s
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "env/calc/calc_env.h"
#include "env/python/problems.h"
#include "env/python/python_env.h"
#include "env/sandbox/sandbox.h"
#include "env/sandbox/sandbox_pool.h"

namespace orrery::env {
namespace {

// Records each iteration's wall time and reports p50/p99 in microseconds.
class Percentiles {
 public:
  void Add(Clock::time_point start) {
    us_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  void Report(benchmark::State& state) {
    if (us_.empty()) return;
    std::sort(us_.begin(), us_.end());
    state.counters["p50_us"] = us_[us_.size() / 2];
    state.counters["p99_us"] = us_[std::min(us_.size() - 1, us_.size() * 99 / 100)];
  }

 private:
  std::vector<double> us_;
};

void BM_CalcStep(benchmark::State& state) {
  std::unique_ptr<Env> env = calc::MakeCalcEnv({});
  std::unique_ptr<Episode> e = std::move(*env->Reset(*env->Task(Split::kTrain, 3), DeadlineIn(5)));
  const ToolCall call{"c", "calculate", R"({"expression": "12 * (3 + 4) / 5 - 0.25"})"};
  Percentiles p;
  for (auto _ : state) {
    const auto start = Clock::now();
    benchmark::DoNotOptimize(e->Step(call, DeadlineIn(5)));
    p.Add(start);
    // A fresh episode every 10 calls keeps the per-episode call budget (16) out of the way.
    if (state.iterations() % 10 == 0) {
      e = std::move(*env->Reset(*env->Task(Split::kTrain, 3), DeadlineIn(5)));
    }
  }
  p.Report(state);
}
BENCHMARK(BM_CalcStep);

void BM_PythonStep(benchmark::State& state) {
  PythonEnvOptions o;
  o.pool_size = 1;
  std::unique_ptr<Env> env = MakePythonEnv(o);
  std::unique_ptr<Episode> e = std::move(*env->Reset(*env->Task(Split::kTrain, 0), DeadlineIn(30)));
  const ToolCall call{"c", "run_python", R"J({"code": "print(sum(range(1000)))"})J"};
  Percentiles p;
  for (auto _ : state) {
    const auto start = Clock::now();
    StatusOr<ToolResult> r = e->Step(call, DeadlineIn(30));
    p.Add(start);
    if (!r.ok() || r->is_error) {
      state.SkipWithError(
          ("run_python failed: " + (r.ok() ? r->content : r.status().ToString())).c_str());
      break;
    }
  }
  p.Report(state);
}
BENCHMARK(BM_PythonStep)->Unit(benchmark::kMillisecond);

// Grading one solution: the reference solution of a sum_of_multiples task against its 6 hidden
// tests (a fresh episode each iteration, untimed).
void BM_PythonScore(benchmark::State& state) {
  PythonEnvOptions o;
  o.pool_size = 1;
  std::unique_ptr<Env> env = MakePythonEnv(o);
  const TaskRef task = *env->Task(Split::kTrain, 0);
  const std::string answer =
      "```python\n" + ReferenceSolution(*MakeCodingTask(0, Split::kTrain, 0)) + "```";
  Percentiles p;
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<Episode> e = std::move(*env->Reset(task, DeadlineIn(30)));
    std::vector<ChatMessage> t = e->initial_messages();
    t.push_back(ChatMessage{ChatRole::kAssistant, answer, {}, "", ""});
    state.ResumeTiming();
    const auto start = Clock::now();
    StatusOr<EpisodeScore> s = e->Score(t, DeadlineIn(60));
    p.Add(start);
    if (!s.ok() || s->reward != 1.0) state.SkipWithError("grading failed");
  }
  p.Report(state);
}
BENCHMARK(BM_PythonScore)->Unit(benchmark::kMillisecond);

void BM_SandboxStartCold(benchmark::State& state) {
  Percentiles p;
  uint32_t slot = 100;
  for (auto _ : state) {
    const auto start = Clock::now();
    std::unique_ptr<Sandbox> s = std::move(*Sandbox::Create(SandboxOptions{}, slot++ % 64));
    StatusOr<RunResult> r = s->Run({"/usr/bin/true"}, "", DeadlineIn(30));
    s.reset();  // removing the work dir is part of the cold cost
    p.Add(start);
    if (!r.ok() || r->exit_code != 0) state.SkipWithError("sandbox run failed");
  }
  p.Report(state);
}
BENCHMARK(BM_SandboxStartCold)->Unit(benchmark::kMillisecond);

void BM_SandboxStartPooled(benchmark::State& state) {
  SandboxPool pool(SandboxOptions{}, 1, 200);
  (void)pool.Acquire(DeadlineIn(5));  // create the one sandbox outside the timed loop
  Percentiles p;
  for (auto _ : state) {
    const auto start = Clock::now();
    std::unique_ptr<PooledSandbox> s = std::move(*pool.Acquire(DeadlineIn(5)));
    StatusOr<RunResult> r = (*s)->Run({"/usr/bin/true"}, "", DeadlineIn(30));
    s.reset();  // back to the pool: the work dir is emptied
    p.Add(start);
    if (!r.ok() || r->exit_code != 0) state.SkipWithError("sandbox run failed");
  }
  p.Report(state);
}
BENCHMARK(BM_SandboxStartPooled)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace orrery::env

BENCHMARK_MAIN();
