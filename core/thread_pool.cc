#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <latch>
#include <mutex>

namespace orrery {
namespace {
thread_local bool t_in_worker = false;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Submit(std::function<void()> task) {
  if (workers_.empty()) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::WorkerLoop() {
  t_in_worker = true;
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_grain = std::max<int64_t>(1, min_grain);
  const int64_t max_chunks = (n + min_grain - 1) / min_grain;
  const int64_t chunks = std::min<int64_t>(max_chunks, num_threads() + 1);
  if (chunks <= 1 || t_in_worker) {
    fn(0, n);
    return;
  }
  std::latch done(chunks - 1);
  const int64_t per = (n + chunks - 1) / chunks;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = c * per, e = std::min(n, b + per);
    Submit([&fn, &done, b, e] {
      if (b < e) fn(b, e);
      done.count_down();
    });
  }
  fn(0, std::min(n, per));
  done.wait();
}

namespace {

std::mutex g_default_mu;
int g_requested_threads = 0;                  // SetDefaultThreads; 0: not set
std::atomic<ThreadPool*> g_default{nullptr};  // owned; replaced only by SetDefaultThreads

// Threads doing ParallelFor work (workers + caller) the default pool should have now.
int DefaultThreads() {
  const char* env = std::getenv("ORRERY_NUM_THREADS");
  const int from_env = env ? std::atoi(env) : 0;
  if (from_env > 0) return from_env;
  if (g_requested_threads > 0) return g_requested_threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

ThreadPool& ThreadPool::Default() {
  ThreadPool* pool = g_default.load(std::memory_order_acquire);
  if (pool != nullptr) return *pool;
  std::lock_guard<std::mutex> lock(g_default_mu);
  pool = g_default.load(std::memory_order_relaxed);
  if (pool == nullptr) {
    // The caller of ParallelFor works too, so one worker fewer than the threads.
    pool = new ThreadPool(DefaultThreads() - 1);
    g_default.store(pool, std::memory_order_release);
  }
  return *pool;
}

int ThreadPool::SetDefaultThreads(int threads) {
  std::lock_guard<std::mutex> lock(g_default_mu);
  g_requested_threads = std::max(0, threads);
  const int workers = DefaultThreads() - 1;
  ThreadPool* pool = g_default.load(std::memory_order_relaxed);
  if (pool != nullptr && pool->num_threads() != workers) {
    g_default.store(new ThreadPool(workers), std::memory_order_release);
    delete pool;  // finishes queued work, joins its workers
  }
  return workers + 1;
}

}  // namespace orrery
