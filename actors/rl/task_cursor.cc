#include "actors/rl/task_cursor.h"

#include <fstream>

#include "core/logging.h"
#include "core/safetensors.h"

namespace orrery::rl_actors {

Status TaskCursor::Load() {
  {
    std::ifstream in(path_);
    if (in && !(in >> committed_)) return DataLossError(path_ + ": damaged task cursor");
  }
  next_ = committed_;
  std::ifstream in(path_ + ".attempts");
  if (!in) return Status::OK();  // no attempts recorded yet
  uint64_t task = 0;
  int n = 0;
  while (in >> task >> n) attempts_[task] = n;
  if (in.bad() || (!in.eof() && in.fail())) {
    return DataLossError(path_ + ".attempts: damaged attempt counts");
  }
  return Status::OK();
}

StatusOr<uint64_t> TaskCursor::Issue() {
  for (;;) {
    const uint64_t k = next_++;
    const uint64_t task = TaskIndex(k);
    int& n = attempts_[task];
    if (n >= max_attempts_) {
      ORRERY_LOG(WARN) << "task " << task << " dropped: issued " << n
                       << " times, and each time this rollout instance ended before its group "
                          "was stored";
      ++dropped_;
      attempts_.erase(task);
      ORRERY_RETURN_IF_ERROR(MarkDone(k));
      continue;
    }
    ++n;
    ORRERY_RETURN_IF_ERROR(WriteAttempts());
    return task;
  }
}

Status TaskCursor::Acknowledge(uint64_t task_index) {
  attempts_.erase(task_index);
  ORRERY_RETURN_IF_ERROR(
      MarkDone((task_index - static_cast<uint64_t>(index_)) / static_cast<uint64_t>(count_)));
  return WriteAttempts();
}

Status TaskCursor::MarkDone(uint64_t k) {
  done_.insert(k);
  const uint64_t before = committed_;
  while (done_.count(committed_)) done_.erase(committed_++);
  if (committed_ == before) return Status::OK();
  return WriteFileAtomic(path_, std::to_string(committed_) + "\n");
}

Status TaskCursor::WriteAttempts() const {
  std::string text;
  for (const auto& [task, n] : attempts_) {
    text += std::to_string(task) + " " + std::to_string(n) + "\n";
  }
  return WriteFileAtomic(path_ + ".attempts", text);
}

}  // namespace orrery::rl_actors
