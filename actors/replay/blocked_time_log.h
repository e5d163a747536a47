// BlockedTimeLog: how long each insert and sample call waited on the rate limiter (Reverb's
// per-call blocked-time records), kept in a ring buffer of the most recent calls so one can plot
// how long actors and learners waited. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace orrery::replay {

enum class BlockedOp { kInsert, kSample };

struct BlockedCall {
  BlockedOp op = BlockedOp::kInsert;
  double start_unix_seconds = 0;
  double blocked_seconds = 0;
};

struct BlockedStats {
  int64_t calls = 0;                          // every call since the table opened
  int64_t blocked_calls = 0;                  // calls that waited at all
  double blocked_seconds_total = 0;           // their waits summed, since the table opened
  double p50_ms = 0, p99_ms = 0, max_ms = 0;  // over the calls still in the ring
};

class BlockedTimeLog {
 public:
  explicit BlockedTimeLog(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}
  void Add(const BlockedCall& call);
  BlockedStats Stats(BlockedOp op) const;
  // The calls in the ring, oldest first.
  std::vector<BlockedCall> Recent() const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  size_t next_ = 0;
  std::vector<BlockedCall> ring_;
  int64_t calls_[2] = {0, 0};
  int64_t blocked_calls_[2] = {0, 0};
  double blocked_seconds_[2] = {0, 0};
};

}  // namespace orrery::replay
