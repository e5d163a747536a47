// BatchLog: the groups a learner rank sampled for each update, kept on disk until a checkpoint
// covers that update.
//
// Sampling from the replay store's queue table removes the groups, so a rank killed between
// sampling and its next checkpoint would otherwise lose them, and a resumed run would train on
// different data. Before each update the rank writes its batch here (atomically); after a restore
// from checkpoint version c, the updates c+1, c+2, ... re-use the logged batches, so the resumed
// run repeats exactly what the killed one did and no acknowledged trajectory is lost.
//
//   <dir>/batch-00000012.bin   the groups of the update that produces version 12
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace orrery::rl_actors {

struct EncodedGroup {
  uint64_t group_id = 0;
  std::vector<std::string> trajectories;  // Cap'n Proto bytes (actors/replay/trajectory.h)
};

class BatchLog {
 public:
  explicit BatchLog(std::string dir) : dir_(std::move(dir)) {}

  Status Save(int64_t version, const std::vector<EncodedGroup>& groups) const;
  // NotFound when no batch was logged for `version`; DataLoss for a damaged file.
  StatusOr<std::vector<EncodedGroup>> Load(int64_t version) const;
  // Deletes the batches of versions <= `version` (covered by a checkpoint).
  Status DropThrough(int64_t version) const;

 private:
  std::string PathOf(int64_t version) const;
  std::string dir_;
};

}  // namespace orrery::rl_actors
