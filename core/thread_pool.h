// A fixed pool of worker threads with a blocking ParallelFor.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace orrery {

class ThreadPool {
 public:
  // num_threads <= 0 uses the number of hardware threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();  // finishes queued work, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()); }
  // Queues `task` to run on a worker.
  void Submit(std::function<void()> task);
  // Runs fn(begin, end) over [0, n) split into contiguous ranges of at least `min_grain`
  // items; the caller takes part and returns when all ranges are done. Safe to call from a
  // worker (then runs inline).
  void ParallelFor(int64_t n, int64_t min_grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool, sized by ORRERY_NUM_THREADS or the hardware.
  static ThreadPool& Default();

 private:
  void WorkerLoop();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
};

}  // namespace orrery
