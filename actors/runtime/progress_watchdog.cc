#include "actors/runtime/progress_watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/logging.h"

namespace orrery {

ProgressWatchdog::ProgressWatchdog(const std::atomic<uint64_t>& counter,
                                   std::chrono::milliseconds timeout, std::string name)
    : counter_(counter), timeout_(timeout), name_(std::move(name)) {
  thread_ = std::thread([this] { Watch(); });
}

ProgressWatchdog::~ProgressWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressWatchdog::Watch() {
  using Clock = std::chrono::steady_clock;
  ScopedLogPrefix prefix(name_);
  // A tenth of the timeout, at most a second: how late after the timeout a stall is noticed.
  const auto period =
      std::clamp(timeout_ / 10, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  uint64_t seen = counter_.load(std::memory_order_relaxed);
  Clock::duration stalled{0};
  auto last = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return done_; })) {
    const auto now = Clock::now();
    // A late wake-up counts as a few periods at most (the process may have been stopped).
    const auto awake = std::min<Clock::duration>(now - last, 4 * period);
    last = now;
    const uint64_t count = counter_.load(std::memory_order_relaxed);
    if (count != seen || count == 0) {  // advanced, or not watched yet
      seen = count;
      stalled = Clock::duration{0};
      continue;
    }
    stalled += awake;
    if (stalled < timeout_) continue;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count();
    ORRERY_LOG(ERROR) << "no progress for " << ms << " ms (counter at " << count
                      << ", --progress-timeout-ms " << timeout_.count()
                      << "): the role's main loop is stuck; ending the process (exit "
                      << kNoProgressExitCode << ")";
    std::fflush(stderr);
    _exit(kNoProgressExitCode);
  }
}

}  // namespace orrery
