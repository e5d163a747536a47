// The persisted task cursor of one rollout instance.
//
// Instance i of N takes train-split task indices i, i + N, i + 2N, ... The cursor (the first task
// whose group the store has not acknowledged) is kept in a file, so a restarted instance re-issues
// exactly the groups that were in flight when it died.
//
// A group that makes the instance die (an environment that crashes the process on it, a task the
// environment cannot make, an item the store refuses) would be re-issued after every restart
// until the fleet's restart budget ran out. So the cursor also records, in `<path>.attempts`, how
// often each unacknowledged task was issued: a task issued `max_attempts` times without being
// acknowledged is dropped (skipped and counted) instead of being issued again. Groups that were
// merely in flight beside the failing one are dropped with it once they have been in flight
// through max_attempts deaths in a row.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "core/status.h"

namespace orrery::rl_actors {

class TaskCursor {
 public:
  TaskCursor(std::string path, int index, int count, int max_attempts = 3)
      : path_(std::move(path)), index_(index), count_(count), max_attempts_(max_attempts) {}

  // Reads the cursor and the attempts (absent files: a fresh start); DataLoss when damaged.
  Status Load();
  // The next task index to issue (persisting its attempt), skipping dropped tasks.
  StatusOr<uint64_t> Issue();
  // Marks a task's group acknowledged; persists the cursor when it moves.
  Status Acknowledge(uint64_t task_index);
  uint64_t committed() const { return committed_; }
  // Tasks dropped by this instance since Load (each logged with its reason).
  int64_t dropped() const { return dropped_; }

 private:
  uint64_t TaskIndex(uint64_t k) const {
    return static_cast<uint64_t>(index_) + k * static_cast<uint64_t>(count_);
  }
  Status MarkDone(uint64_t k);
  Status WriteAttempts() const;

  std::string path_;
  int index_, count_, max_attempts_;
  uint64_t committed_ = 0, next_ = 0;
  std::set<uint64_t> done_;           // acknowledged (or dropped) positions past committed_
  std::map<uint64_t, int> attempts_;  // task index -> times issued, unacknowledged tasks only
  int64_t dropped_ = 0;
};

}  // namespace orrery::rl_actors
