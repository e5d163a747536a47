#include "env/sandbox/run_each.h"

#include <algorithm>

namespace orrery::env {

StatusOr<std::vector<RunResult>> RunEach(Sandbox& sandbox, const std::vector<std::string>& argv,
                                         const std::vector<std::string>& inputs,
                                         double seconds_each, Deadline deadline) {
  std::vector<RunResult> results;
  results.reserve(inputs.size());
  for (const std::string& input : inputs) {
    if (SecondsLeft(deadline) <= 0) {
      return DeadlineExceededError("grading: the deadline passed after " +
                                   std::to_string(results.size()) + " of " +
                                   std::to_string(inputs.size()) + " runs");
    }
    ORRERY_ASSIGN_OR_RETURN(RunResult r,
                            sandbox.Run(argv, input, std::min(deadline, DeadlineIn(seconds_each))));
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace orrery::env
