// Table semantics: eviction, max_times_sampled, Queue, the staleness window, token counting,
// blocking with deadlines and Cancel, transactional priority updates, group atomicity under
// concurrency, and exact recovery from RocksDB.
#include "actors/replay/table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

ItemInput MakeItem(uint64_t group, int trajectories = 1, double priority = 1.0, int64_t tokens = 10,
                   int64_t version = 0) {
  ItemInput in;
  in.group_id = group;
  in.priority = priority;
  in.tokens = tokens;
  in.min_policy_version = version;
  for (int i = 0; i < trajectories; ++i) {
    in.trajectories.push_back("g" + std::to_string(group) + "t" + std::to_string(i));
  }
  return in;
}

TableOptions Options(const std::string& name) {
  TableOptions o;
  o.name = name;
  o.limiter = *MinSizeLimiter(1);
  return o;
}

uint64_t MustInsert(Table& t, ItemInput in) {
  StatusOr<InsertOutcome> out = t.Insert(std::move(in), DeadlineFromTimeoutMs(0));
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? out->key : 0;
}

TEST(TableTest, MaxSizeEvictsWithRemover) {
  TableOptions o = Options("t");
  o.max_size = 3;
  o.remover = {SelectorKind::kMinHeap, 1.0};
  auto t = *Table::Open(o, nullptr);
  MustInsert(*t, MakeItem(1, 1, 5.0));
  MustInsert(*t, MakeItem(2, 1, 1.0));
  MustInsert(*t, MakeItem(3, 1, 3.0));
  MustInsert(*t, MakeItem(4, 1, 4.0));  // evicts key 2 (lowest priority)
  std::vector<uint64_t> keys;
  for (auto& [k, s] : t->Items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<uint64_t>{1, 3, 4}));
  TableInfo info = t->Info();
  EXPECT_EQ(info.counters.inserts, 4);
  EXPECT_EQ(info.counters.deletes, 1);
}

TEST(TableTest, QueueSamplesEachItemOnceInOrderAndBlocksWhenFull) {
  TableOptions o = Options("queue");
  o.sampler = {SelectorKind::kFifo, 1.0};
  o.remover = {SelectorKind::kFifo, 1.0};
  o.max_times_sampled = 1;
  o.max_size = 2;
  o.limiter = *QueueLimiter(2);
  auto t = *Table::Open(o, nullptr);
  MustInsert(*t, MakeItem(1));
  MustInsert(*t, MakeItem(2));
  ItemInput third = MakeItem(3);
  EXPECT_FALSE(t->TryInsert(third)->has_value());  // full: the limiter blocks
  EXPECT_EQ(t->Insert(MakeItem(3), DeadlineFromTimeoutMs(20)).status().code(),
            StatusCode::kDeadlineExceeded);
  auto s = *t->Sample({2, -1, -1}, DeadlineFromTimeoutMs(0));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].state.group_id, 1u);
  EXPECT_EQ(s[1].state.group_id, 2u);
  EXPECT_EQ(t->Info().size, 0);
  EXPECT_EQ(t->Sample({1, -1, -1}, DeadlineFromTimeoutMs(10)).status().code(),
            StatusCode::kDeadlineExceeded);
  MustInsert(*t, MakeItem(3));
  EXPECT_EQ(t->Info().sample_blocked.calls, 2);
  // The waits are summed: the insert and the sample that waited until their deadlines (20 and
  // 10 ms) at least.
  EXPECT_GE(t->Info().insert_blocked.blocked_seconds_total, 0.015);
  EXPECT_GE(t->Info().sample_blocked.blocked_seconds_total, 0.008);
}

// Items the staleness window evicts are never sampled: the samples they owed the limiter are
// forgiven. Before, a Queue(2) table that had evicted two stale items refused every insert while
// it was empty (diff = inserts - samples stuck at 2), and the RL fleet waited forever (an
// rl.launch_faults hang). Also after a restart: the forgiven count is stored with the table.
TEST(TableTest, QueueKeepsAcceptingAfterStaleEvictions) {
  TestDir dir;
  StorageOptions so;
  so.path = dir.Sub("db");
  TableOptions o = Options("queue");
  o.sampler = {SelectorKind::kFifo, 1.0};
  o.remover = {SelectorKind::kFifo, 1.0};
  o.max_times_sampled = 1;
  o.max_size = 2;
  o.max_staleness = 1;
  o.limiter = *QueueLimiter(2);
  auto storage = *Storage::Open(so);
  auto t = *Table::Open(o, storage.get());
  for (int64_t version = 0; version < 3; ++version) {
    MustInsert(*t, MakeItem(10 * version + 1, 1, 1.0, 10, version));
    MustInsert(*t, MakeItem(10 * version + 2, 1, 1.0, 10, version));
    ASSERT_EQ(*t->SetLearnerVersion(version + 2), 2) << version;  // both stale now
    EXPECT_EQ(t->Info().size, 0);
  }
  t.reset();
  storage.reset();
  storage = *Storage::Open(so);
  t = *Table::Open(o, storage.get());
  MustInsert(*t, MakeItem(100, 1, 1.0, 10, 4));
  ItemInput second = MakeItem(101, 1, 1.0, 10, 4);
  ASSERT_TRUE(t->TryInsert(second)->has_value()) << "an empty queue refuses inserts";
  ItemInput third = MakeItem(102, 1, 1.0, 10, 4);
  EXPECT_FALSE(t->TryInsert(third)->has_value());  // full: the limiter still bounds the queue
  auto s = *t->Sample({2, 4, -1}, DeadlineFromTimeoutMs(0));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].state.group_id, 100u);
  EXPECT_EQ(t->Info().stale_evicted, 6);
}

TEST(TableTest, MaxTimesSampledDeletes) {
  TableOptions o = Options("t");
  o.max_times_sampled = 3;
  auto t = *Table::Open(o, nullptr);
  MustInsert(*t, MakeItem(1));
  for (uint32_t i = 1; i <= 3; ++i) {
    auto s = *t->Sample({1, -1, -1}, DeadlineFromTimeoutMs(0));
    EXPECT_EQ(s[0].state.times_sampled, i);
  }
  EXPECT_EQ(t->Info().size, 0);
  EXPECT_EQ(t->Info().counters.deletes, 1);
}

TEST(TableTest, StalenessWindowDropsEvictsAndCounts) {
  TableOptions o = Options("t");
  o.max_staleness = 2;
  auto t = *Table::Open(o, nullptr);
  ASSERT_EQ(*t->SetLearnerVersion(5), 0);
  StatusOr<InsertOutcome> dropped = t->Insert(MakeItem(1, 1, 1, 10, 2), NoDeadline());  // 5-2 > 2
  ASSERT_TRUE(dropped.ok());
  EXPECT_TRUE(dropped->dropped_stale);
  const uint64_t k3 = MustInsert(*t, MakeItem(2, 1, 1, 10, 3));
  const uint64_t k5 = MustInsert(*t, MakeItem(3, 1, 1, 10, 5));
  EXPECT_NE(k3, 0u);
  // Sampling at learner version 6 first evicts the version-3 item (6-3 > 2): only k5 remains.
  for (int i = 0; i < 20; ++i) {
    auto s = *t->Sample({1, 6, -1}, NoDeadline());
    EXPECT_EQ(s[0].key, k5);
  }
  TableInfo info = t->Info();
  EXPECT_EQ(info.stale_evicted, 2);
  EXPECT_EQ(info.size, 1);
  EXPECT_EQ(info.learner_version, 6);
  EXPECT_EQ(info.counters.inserts - info.counters.deletes, 1);
  EXPECT_EQ(*t->SetLearnerVersion(4), 0);  // never backwards
  EXPECT_EQ(*t->SetLearnerVersion(8), 1);
}

TEST(TableTest, TokenCountingRatio) {
  TableOptions o = Options("t");
  o.count_unit = CountUnit::kTokens;
  // One sampled token per inserted token, sampling starts at 100 tokens, buffer 150.
  o.limiter = *SampleToInsertRatioLimiter(1.0, 100, 150.0);
  auto t = *Table::Open(o, nullptr);
  MustInsert(*t, MakeItem(1, 1, 1, 60));
  EXPECT_TRUE(t->TrySample({1, -1, -1})->empty());  // 60 tokens < 100
  MustInsert(*t, MakeItem(2, 1, 1, 60));
  // 120*1 - 0 - 60 >= -50: the first sample is allowed; budget: 120 - samples - cost >= -50.
  auto s = *t->TrySample({10, -1, -1});
  EXPECT_EQ(s.size(), 2u);  // 120-0-60 = 60, 120-60-60 = 0, 120-120-60 = -60 < -50
  EXPECT_EQ(t->Info().counters.samples, 120);
  ItemInput zero = MakeItem(3, 1, 1, 0);
  EXPECT_EQ(t->TryInsert(zero).status().code(), StatusCode::kInvalidArgument);
}

TEST(TableTest, CancelWakesAllWaiters) {
  auto t = *Table::Open(Options("t"), nullptr);
  std::atomic<int> cancelled{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      if (t->Sample({1, -1, -1}, NoDeadline()).status().code() == StatusCode::kCancelled) {
        ++cancelled;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  t->Cancel();
  for (auto& w : waiters) w.join();
  EXPECT_EQ(cancelled.load(), 4);
}

TEST(TableTest, PriorityUpdatesAreAllOrNothing) {
  TableOptions o = Options("t");
  o.sampler = {SelectorKind::kMaxHeap, 1.0};
  auto t = *Table::Open(o, nullptr);
  const uint64_t a = MustInsert(*t, MakeItem(1, 1, 1.0));
  const uint64_t b = MustInsert(*t, MakeItem(2, 1, 2.0));
  EXPECT_FALSE(t->UpdatePriorities({{a, 10.0}, {b, -1.0}}, {}).ok());
  EXPECT_EQ(t->Items()[0].second.priority, 1.0);  // unchanged
  UpdateOutcome u = *t->UpdatePriorities({{a, 10.0}, {999, 1.0}}, {b});
  EXPECT_EQ(u.updated, 1);
  EXPECT_EQ(u.deleted, 1);
  EXPECT_EQ(u.missing, 1);
  EXPECT_EQ((*t->Sample({1, -1, -1}, NoDeadline()))[0].key, a);
}

TEST(TableTest, RejectsBadItems) {
  TableOptions o = Options("t");
  o.max_item_bytes = 10;
  auto t = *Table::Open(o, nullptr);
  ItemInput big = MakeItem(1);
  big.trajectories[0] = std::string(11, 'x');
  EXPECT_EQ(t->TryInsert(big).status().code(), StatusCode::kResourceExhausted);
  ItemInput empty = MakeItem(1, 0);
  EXPECT_EQ(t->TryInsert(empty).status().code(), StatusCode::kInvalidArgument);
  ItemInput nan = MakeItem(1, 1, std::nan(""));
  EXPECT_EQ(t->TryInsert(nan).status().code(), StatusCode::kInvalidArgument);
  TableOptions bad = Options("bad/name");
  EXPECT_FALSE(Table::Open(bad, nullptr).ok());
}

// Producers insert groups of 8 trajectories while consumers sample: every sampled item is a whole
// group (all 8 trajectories, all of that group) and the counters balance at the end.
TEST(TableTest, GroupsMoveAtomicallyUnderConcurrency) {
  TestDir dir;
  StorageOptions so;
  so.path = dir.Sub("db");
  so.sync_each_write = false;
  so.group_commit_ms = 1;
  auto storage = *Storage::Open(so);
  TableOptions o = Options("groups");
  o.max_size = 50;
  o.max_times_sampled = 2;
  o.limiter = *SampleToInsertRatioLimiter(1.0, 4, 20.0);
  auto t = *Table::Open(o, storage.get());
  constexpr int kProducers = 3, kGroupsEach = 60, kGroupSize = 8;
  std::atomic<bool> producers_done{false};
  std::atomic<int> bad{0}, sampled{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int g = 0; g < kGroupsEach; ++g) {
        const uint64_t group = static_cast<uint64_t>(p * 1000 + g + 1);
        if (!t->Insert(MakeItem(group, kGroupSize), DeadlineFromTimeoutMs(5000)).ok()) ++bad;
      }
    });
  }
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&] {
      while (true) {
        auto s = t->Sample({3, -1, -1}, DeadlineFromTimeoutMs(50));
        if (!s.ok()) {
          if (producers_done) break;
          continue;
        }
        for (const SampledItem& item : *s) {
          ++sampled;
          if (item.trajectories->size() != kGroupSize) ++bad;
          for (int i = 0; i < kGroupSize; ++i) {
            const std::string want =
                "g" + std::to_string(item.state.group_id) + "t" + std::to_string(i);
            if ((*item.trajectories)[i] != want) ++bad;
          }
        }
      }
    });
  }
  for (int p = 0; p < kProducers; ++p) threads[p].join();
  producers_done = true;
  for (size_t i = kProducers; i < threads.size(); ++i) threads[i].join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(sampled.load(), 0);
  TableInfo info = t->Info();
  EXPECT_EQ(info.counters.inserts, kProducers * kGroupsEach);
  EXPECT_EQ(info.counters.inserts - info.counters.deletes, info.size);
  EXPECT_EQ(info.counters.samples, sampled.load());
}

// Runs the same operations on a table that is closed and reopened halfway and on one that is
// not: after recovery the items, priorities, counters and the next samples are identical.
TEST(TableTest, RecoversExactlyFromStorage) {
  TestDir dir;
  auto run = [&](const std::string& path, bool reopen) {
    std::vector<uint64_t> sampled_keys;
    std::vector<std::pair<uint64_t, ItemState>> items_after;
    TableInfo info;
    TableOptions o = Options("prio");
    o.sampler = {SelectorKind::kPrioritized, 0.8};
    o.max_size = 40;
    o.max_times_sampled = 5;
    o.seed = 42;
    o.max_staleness = 3;
    StorageOptions so;
    so.path = path;
    auto storage = *Storage::Open(so);
    auto t = *Table::Open(o, storage.get());
    for (int i = 0; i < 60; ++i) MustInsert(*t, MakeItem(i + 1, 2, 1.0 + i % 7, 10, i / 10));
    for (int i = 0; i < 20; ++i) {
      std::vector<SampledItem> batch = *t->Sample({2, -1, i}, NoDeadline());
      for (auto& s : batch) sampled_keys.push_back(s.key);
    }
    EXPECT_TRUE(t->UpdatePriorities({{50, 0.5}, {51, 9.0}}, {52}).ok());
    EXPECT_TRUE(t->SetLearnerVersion(7).ok());
    if (reopen) {
      t.reset();
      storage.reset();
      storage = *Storage::Open(so);
      t = *Table::Open(o, storage.get());
    }
    for (int i = 0; i < 30; ++i) {
      std::vector<SampledItem> batch = *t->Sample({1, -1, -1}, NoDeadline());
      for (auto& s : batch) sampled_keys.push_back(s.key);
    }
    EXPECT_EQ(t->ReadBatchLog()->size(), 20u);
    return std::make_tuple(sampled_keys, t->Items(), t->Info());
  };
  auto [keys_a, items_a, info_a] = run(dir.Sub("a"), false);
  auto [keys_b, items_b, info_b] = run(dir.Sub("b"), true);
  EXPECT_EQ(keys_a, keys_b);
  ASSERT_EQ(items_a.size(), items_b.size());
  for (size_t i = 0; i < items_a.size(); ++i) {
    EXPECT_EQ(items_a[i].first, items_b[i].first);
    EXPECT_EQ(items_a[i].second.priority, items_b[i].second.priority);
    EXPECT_EQ(items_a[i].second.times_sampled, items_b[i].second.times_sampled);
    EXPECT_EQ(items_a[i].second.tiebreak, items_b[i].second.tiebreak);
  }
  EXPECT_EQ(info_a.counters.inserts, info_b.counters.inserts);
  EXPECT_EQ(info_a.counters.samples, info_b.counters.samples);
  EXPECT_EQ(info_a.counters.deletes, info_b.counters.deletes);
  EXPECT_EQ(info_a.stale_evicted, info_b.stale_evicted);
  EXPECT_GT(info_b.stale_evicted, 0);
  EXPECT_EQ(info_a.learner_version, 7);
  EXPECT_EQ(info_b.learner_version, 7);
}

TEST(TableTest, CheckpointRestores) {
  TestDir dir;
  StorageOptions so;
  so.path = dir.Sub("db");
  {
    auto storage = *Storage::Open(so);
    auto t = *Table::Open(Options("t"), storage.get());
    for (int i = 0; i < 5; ++i) MustInsert(*t, MakeItem(i + 1));
    ASSERT_TRUE(storage->Checkpoint(dir.Sub("ckpt")).ok());
    MustInsert(*t, MakeItem(6));  // after the checkpoint: not in it
    EXPECT_EQ(storage->Checkpoint(dir.Sub("ckpt")).code(), StatusCode::kAlreadyExists);
  }
  StorageOptions restored;
  restored.path = dir.Sub("restored");
  restored.restore_from = dir.Sub("ckpt");
  auto storage = *Storage::Open(restored);
  auto t = *Table::Open(Options("t"), storage.get());
  EXPECT_EQ(t->Info().size, 5);
  EXPECT_EQ(t->Info().counters.inserts, 5);
  StorageOptions missing;
  missing.path = dir.Sub("other");
  missing.restore_from = dir.Sub("nope");
  EXPECT_EQ(Storage::Open(missing).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace orrery::replay
