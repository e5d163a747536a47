// How learner ranks agree, after any restart, on where to resume and on a fresh Gloo generation.
//
// Rank 0 picks the newest checkpoint and writes RUN/rl/gloo/start.json = {"generation",
// "checkpoint"} (atomically; the generation is unique per start). Every other rank waits for a
// start file whose generation differs from the one it used last (kept in its state directory),
// then restores that exact checkpoint and joins that generation. So ranks restarted at different
// moments still meet: a rank whose peer died fails its next collective, exits, is restarted, and
// follows the next start rank 0 writes; a checkpoint written in between cannot split the ranks.
#pragma once

#include <chrono>
#include <string>

#include "actors/runtime/cancellation.h"
#include "core/status.h"

namespace orrery::rl_actors {

struct LearnerStart {
  std::string generation;
  std::string checkpoint;  // "" : start from the initial policy
};

// Rank 0: writes and returns a new start for `checkpoint`.
StatusOr<LearnerStart> PublishLearnerStart(const std::string& gloo_dir,
                                           const std::string& checkpoint);

// Ranks > 0: waits (until `timeout`, or `stop`) for a start whose generation is not
// `last_generation`.
StatusOr<LearnerStart> AwaitLearnerStart(const std::string& gloo_dir,
                                         const std::string& last_generation,
                                         const Cancellation& stop,
                                         std::chrono::milliseconds timeout);

}  // namespace orrery::rl_actors
