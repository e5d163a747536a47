#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace orrery {
namespace {

TEST(ThreadPoolTest, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 1000, 12345}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.ParallelFor(n, 10, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, NestedParallelForRunsInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(100, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
    }
  });
  EXPECT_EQ(total.load(), 400);
}

TEST(ThreadPoolTest, SubmitRunsEverythingBeforeDestruction) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 100; ++i) pool.Submit([&] { done++; });
  }
  EXPECT_EQ(done.load(), 100);
}

TEST(ThreadPoolTest, ZeroWorkersRunEverythingOnTheCaller) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 0);
  const std::thread::id me = std::this_thread::get_id();
  int calls = 0;
  pool.ParallelFor(1000, 1, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_EQ(e - b, 1000);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  bool ran = false;
  pool.Submit([&] { ran = std::this_thread::get_id() == me; });
  EXPECT_TRUE(ran);  // ran before Submit returned
}

TEST(ThreadPoolTest, SetDefaultThreadsResizesTheDefaultPoolUnlessTheEnvironmentDecides) {
  const char* saved = std::getenv("ORRERY_NUM_THREADS");
  const std::string saved_value = saved ? saved : "";
  ::unsetenv("ORRERY_NUM_THREADS");
  EXPECT_EQ(ThreadPool::SetDefaultThreads(3), 3);
  EXPECT_EQ(ThreadPool::Default().num_threads(), 2);  // the caller is the third
  EXPECT_EQ(ThreadPool::SetDefaultThreads(1), 1);
  EXPECT_EQ(ThreadPool::Default().num_threads(), 0);
  std::atomic<int64_t> covered{0};
  ThreadPool::Default().ParallelFor(100, 1, [&](int64_t b, int64_t e) { covered += e - b; });
  EXPECT_EQ(covered.load(), 100);
  ::setenv("ORRERY_NUM_THREADS", "2", 1);  // the environment wins over the config
  EXPECT_EQ(ThreadPool::SetDefaultThreads(4), 2);
  EXPECT_EQ(ThreadPool::Default().num_threads(), 1);
  if (saved) {
    ::setenv("ORRERY_NUM_THREADS", saved_value.c_str(), 1);
  } else {
    ::unsetenv("ORRERY_NUM_THREADS");
  }
  ThreadPool::SetDefaultThreads(0);  // back to the environment or the hardware
}

}  // namespace
}  // namespace orrery
