#include "actors/replay/blocked_time_log.h"

#include <algorithm>

namespace orrery::replay {

void BlockedTimeLog::Add(const BlockedCall& call) {
  std::lock_guard<std::mutex> lock(mu_);
  const int op = static_cast<int>(call.op);
  ++calls_[op];
  if (call.blocked_seconds > 0) {
    ++blocked_calls_[op];
    blocked_seconds_[op] += call.blocked_seconds;
  }
  if (ring_.size() < capacity_) {
    ring_.push_back(call);
  } else {
    ring_[next_] = call;
  }
  next_ = (next_ + 1) % capacity_;
}

BlockedStats BlockedTimeLog::Stats(BlockedOp op) const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockedStats stats;
  stats.calls = calls_[static_cast<int>(op)];
  stats.blocked_calls = blocked_calls_[static_cast<int>(op)];
  stats.blocked_seconds_total = blocked_seconds_[static_cast<int>(op)];
  std::vector<double> ms;
  for (const BlockedCall& c : ring_) {
    if (c.op == op) ms.push_back(c.blocked_seconds * 1e3);
  }
  if (ms.empty()) return stats;
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[static_cast<size_t>(q * static_cast<double>(ms.size() - 1))];
  };
  stats.p50_ms = at(0.5);
  stats.p99_ms = at(0.99);
  stats.max_ms = ms.back();
  return stats;
}

std::vector<BlockedCall> BlockedTimeLog::Recent() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.size() < capacity_) return ring_;
  std::vector<BlockedCall> out(ring_.begin() + static_cast<long>(next_), ring_.end());
  out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<long>(next_));
  return out;
}

}  // namespace orrery::replay
