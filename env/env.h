// The environment interface: what a rollout actor drives during agentic RL.
//
// An Env is a task source plus an episode factory. It is shared by many threads: Task() and
// Reset() may be called concurrently, and each Episode is used by one caller at a time, so many
// episodes run in flight at once without locks in the caller.
//
//   env->Task(Split::kTrain, i)        -> TaskRef (id, split, seed, index)
//   env->Reset(task, deadline)         -> Episode: initial messages + tool specs
//   episode->Step(call, deadline)      -> ToolResult (text, error flag, latency)
//   episode->Score(trajectory, deadline) -> EpisodeScore (reward + named components)
//
// Failures of the model (bad JSON, an unknown tool, arguments violating the schema, code that
// crashes in the sandbox) are ToolResults with is_error set: the model sees them. A non-OK Status
// means the environment itself failed (a sandbox could not start, a deadline passed) and the
// rollout marks the episode as an environment failure rather than blaming the policy.
// No call blocks past its deadline: it returns DeadlineExceeded (and kills what it started).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/chat.h"
#include "core/status.h"
#include "env/split.h"

namespace orrery::env {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
// A deadline `seconds` from now.
Deadline DeadlineIn(double seconds);
// Seconds left before `deadline` (negative when passed).
double SecondsLeft(Deadline deadline);

struct TaskRef {
  std::string id;  // unique and stable: "calc/train/d2/<seed>/<index>"
  Split split = Split::kTrain;
  uint64_t seed = 0;
  uint64_t index = 0;
};

// A tool in the common function-calling shape:
// {"type":"function","function":{"name":...,"description":...,"parameters":<JSON Schema>}}
struct ToolSpec {
  std::string name;
  std::string description;
  std::string parameters_json;  // a JSON Schema object for the arguments
  std::string ToJson() const;
};
std::string ToolSpecsToJson(const std::vector<ToolSpec>& tools);  // a JSON array

struct ToolResult {
  std::string content;  // what the model reads in the tool message
  bool is_error = false;
  double latency_s = 0;  // wall time of the call, measured by the environment
};

struct EpisodeScore {
  double reward = 0;
  std::map<std::string, double> components;  // named parts ("correct", "tests_passed", ...)
};

class Episode {
 public:
  virtual ~Episode() = default;
  // The initial messages ([system], user) and the tools the model may call.
  virtual const std::vector<ChatMessage>& initial_messages() const = 0;
  virtual const std::vector<ToolSpec>& tools() const = 0;
  // Runs one tool call. Model mistakes come back as an error ToolResult (see above).
  virtual StatusOr<ToolResult> Step(const ToolCall& call, Deadline deadline) = 0;
  // Scores the whole trajectory (initial messages included, as the model saw them).
  virtual StatusOr<EpisodeScore> Score(const std::vector<ChatMessage>& trajectory,
                                       Deadline deadline) = 0;
};

// What the caller will ask of an environment at once, known when it is created.
struct EnvDemand {
  // Episodes open at the same time (a rollout actor's [rl.rollout] slots); 0 when unknown.
  // Sandbox pools default to this many sandboxes, and a pool_size below it is a config error:
  // an episode without a sandbox would wait for its deadline.
  int episodes_in_flight = 0;
  std::string source;  // where the number comes from, for messages: "rl.rollout.slots"
};

class Env {
 public:
  virtual ~Env() = default;
  virtual std::string name() const = 0;
  // Task `index` of `split`: deterministic for a given environment configuration.
  virtual StatusOr<TaskRef> Task(Split split, uint64_t index) const = 0;
  // The family a task belongs to, for pass rates per family (actors/rl/policy_eval.h): tasks of
  // one family are alike in what they ask ("calc/d2": two operations). Default: the name.
  virtual std::string Family(const TaskRef& task) const {
    (void)task;
    return name();
  }
  virtual StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& task, Deadline deadline) = 0;
};

}  // namespace orrery::env
