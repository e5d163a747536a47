// Storage group commit: a write's ticket becomes durable through the syncer, the durability
// listener fires after the fsync that covers it (and never once removed), and group_commit_ms
// stays the shortest time between fsync starts.
#include "actors/replay/storage.h"

#include <gtest/gtest.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

std::unique_ptr<Storage> OpenGroupCommit(const std::string& path, int64_t group_commit_ms) {
  StorageOptions so;
  so.path = path;
  so.sync_each_write = false;
  so.group_commit_ms = group_commit_ms;
  return *Storage::Open(so);
}

uint64_t PutOne(Storage& storage, int i) {
  rocksdb::WriteBatch batch;
  batch.Put("k" + std::to_string(i), std::string(1000, 'v'));
  return *storage.Write(&batch);
}

TEST(StorageTest, ListenerFiresAfterTheFsyncThatCoversAWrite) {
  TestDir dir;
  auto storage = OpenGroupCommit(dir.Sub("db"), 1);
  std::atomic<uint64_t> durable_seen{0};
  std::atomic<int> calls{0};
  storage->SetDurableListener([&] {
    durable_seen = storage->durable_ticket();
    ++calls;
  });
  const uint64_t ticket = PutOne(*storage, 0);
  ASSERT_GE(ticket, 1u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (calls.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(calls.load(), 0) << "the listener was never called";
  EXPECT_GE(durable_seen.load(), ticket);  // called only once the write is durable
  EXPECT_TRUE(storage->WaitDurable(ticket).ok());

  storage->SetDurableListener(nullptr);
  const int before = calls.load();
  EXPECT_TRUE(storage->WaitDurable(PutOne(*storage, 1)).ok());
  EXPECT_EQ(calls.load(), before);
}

// The interval stays a floor between fsync starts (starting the next fsync right after a slow one
// must not turn into an fsync storm): a writer that waits for each write to be durable gets one
// fsync per 50 ms interval, so 20 writes take at least 19 intervals.
TEST(StorageTest, IntervalIsAFloorBetweenFsyncs) {
  TestDir dir;
  auto storage = OpenGroupCommit(dir.Sub("db"), 50);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(storage->WaitDurable(PutOne(*storage, i)).ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.9);
  EXPECT_LT(s, 10.0);  // a stalled syncer (generous: a loaded 2-core CI machine)
}

}  // namespace
}  // namespace orrery::replay
