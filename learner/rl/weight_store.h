// WeightStore: how the learner publishes policy version v to rollout actors, through a directory
// every actor can read (RUN/weights on one machine; a shared filesystem across machines).
//
//   RUN/weights/v-00000012.safetensors   every parameter and balancing bias, by checkpoint name
//
// Publish writes the file atomically (temp + fsync + rename), so a reader sees a whole version or
// none, then deletes versions older than the newest `keep`. A restarted rollout actor simply loads
// Latest(). Each side reports its time by phase, the weight-sync metric of spec §6.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::rl {

struct PublishTimings {
  double snapshot_seconds = 0;  // copying the tensors out of the live model
  double write_seconds = 0;     // serialise + fsync + rename
  int64_t bytes = 0;
};

struct LoadTimings {
  double read_seconds = 0;  // open + copy out of the mapping
  int64_t bytes = 0;
};

class WeightStore {
 public:
  explicit WeightStore(std::string dir, int64_t keep = 3) : dir_(std::move(dir)), keep_(keep) {}

  StatusOr<PublishTimings> Publish(const std::vector<std::pair<std::string, Tensor>>& named,
                                   int64_t version);
  // The newest published version; NotFound when there is none.
  StatusOr<int64_t> Latest() const;
  // The tensors of `version` (deep copies: the file may be deleted afterwards).
  StatusOr<std::vector<std::pair<std::string, Tensor>>> Load(int64_t version,
                                                             LoadTimings* timings = nullptr) const;
  std::string PathOf(int64_t version) const;
  // Deletes every version but the newest `keep` (Publish does this after each write; a rollout
  // that copies versions in from the learner, actors/rl/weight_fetcher.h, calls it itself).
  void Prune() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int64_t keep_;
};

}  // namespace orrery::rl
