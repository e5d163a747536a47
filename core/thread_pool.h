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
  // num_threads workers; < 0: the number of hardware threads. With 0 workers every task runs on
  // the thread that submits it (a pool of one thread: the caller).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();  // finishes queued work, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()); }
  // Queues `task` to run on a worker (runs it now when the pool has none).
  void Submit(std::function<void()> task);
  // Runs fn(begin, end) over [0, n) split into contiguous ranges of at least `min_grain`
  // items; the caller takes part and returns when all ranges are done. Safe to call from a
  // worker (then runs inline).
  void ParallelFor(int64_t n, int64_t min_grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool. Its size in threads doing ParallelFor work (the caller and size - 1
  // workers), in order of precedence: ORRERY_NUM_THREADS when set to a positive number, else the
  // last SetDefaultThreads(n > 0) (a command's [run] threads), else the hardware threads.
  static ThreadPool& Default();
  // Sets the size Default() has (0: the hardware threads; ORRERY_NUM_THREADS still wins) and
  // returns the size in effect. If the pool already exists with another size it is rebuilt, so
  // call it only while no work runs on the pool (at startup, before the first kernel).
  static int SetDefaultThreads(int threads);

 private:
  void WorkerLoop();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
};

}  // namespace orrery
