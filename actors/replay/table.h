// Table: one replay table (DeepMind Reverb semantics plus what LLM RL needs; docs/replay.md).
//
// An item is a *group* of trajectories (a GRPO/RLOO group, or a single trajectory) that is
// inserted, sampled and evicted as a unit: one key, one priority, one times_sampled. A table has
// a sampler and a remover (ItemSelector), max_size (the remover evicts before an insert into a
// full table), max_times_sampled (an item is deleted after that many samples), a RateLimiter
// counting items or tokens, and a policy-version window: with max_staleness = eta >= 0, an item
// whose oldest token was produced at version v is never sampled once learner_version - v > eta;
// it is evicted when the learner version advances (or dropped at insert) and counted.
//
// An insert may carry an idempotency key: the table remembers the outcome of its last
// idempotency_window keyed inserts (durably, in the insert's own write batch), and an insert
// whose key it remembers is answered with that first outcome (duplicate = true) instead of being
// stored again, even when the first item was sampled or evicted since.
//
// A sample may name a claimant (a learner rank) and its session (the rank's incarnation): an item
// that sample would delete (max_times_sampled reached) is *claimed* instead: no longer sampled,
// but kept with its payload until the claimant acknowledges the batch step it was sampled for
// (Acknowledge), i.e. until the claimant's own log of the batch is safe. A sample by another
// session of the same claimant (the rank restarted) first gets the unacknowledged claims back
// (redelivered), so a learner killed between a sample and its batch log loses nothing.
//
// Payloads live only in RocksDB (a table without storage keeps them in memory): a sample reads
// them back through the block cache, so the store's memory does not grow with its contents.
//
// Every mutation is first applied in memory and then written to Storage as one WriteBatch (items,
// payloads and counters together) and returns a Storage ticket: a caller replies only once the
// ticket is durable (Storage::durable_ticket), so in group-commit mode nothing a reply shows (an
// item sampled, a priority, a deletion) can be lost after the reply. The ticket is the write's
// own, except for a sample whose write only counts: on a table without max_times_sampled, a
// sample that neither logs a batch nor advances the learner version changes only times_sampled,
// the limiter's sample count and the random stream's offset. Its ticket is that of the latest
// write of an item it returns (its insert or priority update), and its own write becomes durable
// with the next WAL fsync: a power loss may take back such samples (times_sampled and the sample
// count are recovered at least as they were at the last fsync, at most as acknowledged), never
// an item a sample showed. The blocking calls (Insert, Sample) wait for their ticket themselves. If
// a write fails the table refuses every later call with the storage error: the caller was not
// acknowledged, and restarting recovers the last consistent state from disk.
//
// Thread-safe. Try* calls never wait (the replay actor parks requests itself); Insert and Sample
// wait for the rate limiter until a deadline or Cancel().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/replay/blocked_time_log.h"
#include "actors/replay/item_selector.h"
#include "actors/replay/rate_limiter.h"
#include "actors/replay/records.h"
#include "actors/replay/storage.h"
#include "core/philox.h"
#include "core/status.h"

namespace orrery::replay {

using Deadline = std::chrono::steady_clock::time_point;
inline Deadline NoDeadline() { return Deadline::max(); }
Deadline DeadlineFromTimeoutMs(int64_t timeout_ms);  // < 0: none; 0: now

enum class CountUnit { kItems, kTokens };

struct TableOptions {
  std::string name;
  SelectorOptions sampler;
  SelectorOptions remover{SelectorKind::kFifo, 1.0};
  int64_t max_size = 1 << 20;
  int32_t max_times_sampled = 0;  // 0: unlimited
  RateLimiterOptions limiter;
  CountUnit count_unit = CountUnit::kItems;
  int64_t max_staleness = -1;  // eta; < 0: no policy-version window
  uint64_t seed = 0;           // the sampler's and remover's random stream
  int64_t max_item_bytes = 256ll << 20;
  size_t blocked_log_capacity = 4096;
  int64_t idempotency_window = 1 << 16;  // idempotency keys remembered (the most recent ones)
};

Status ValidateTableOptions(const TableOptions& options);

// What a producer inserts.
struct ItemInput {
  uint64_t group_id = 0;
  double priority = 1.0;
  int64_t tokens = 0;  // rate-limiter cost in token mode (>= 1 there)
  int64_t min_policy_version = 0;
  std::vector<std::string> trajectories;  // at least one
  // Non-empty (at most 1024 bytes): inserts with the same key store the group once; a retry is
  // answered with the first insert's outcome. A key belongs to one group id.
  std::string idempotency_key;
};

struct InsertOutcome {
  uint64_t key = 0;  // 0 when dropped as stale
  bool dropped_stale = false;
  bool duplicate = false;  // the first outcome of an earlier insert with the same idempotency key
  uint64_t ticket = 0;     // Storage ticket: acknowledge once durable
};

struct SampleOptions {
  SampleOptions(int max_items = 1, int64_t learner_version = -1, int64_t batch_step = -1)
      : max_items(max_items), learner_version(learner_version), batch_step(batch_step) {}

  int max_items = 1;             // returns between 1 and max_items items
  int64_t learner_version = -1;  // >= 0: advance the learner version first
  int64_t batch_step = -1;       // >= 0: log the sampled keys as this learner step's batch
  // Non-empty (needs batch_step >= 0): claim instead of delete (see above).
  std::string claimant;
  uint64_t claim_session = 0;
};

struct SampledItem {
  uint64_t key = 0;
  ItemState state;  // times_sampled includes this sample
  double probability = 0;
  int64_t table_size = 0;  // before this sample
  std::shared_ptr<const std::vector<std::string>> trajectories;
  // A claim of an earlier session of the claimant, handed back (probability 0, times_sampled
  // not counted again).
  bool redelivered = false;
};

struct UpdateOutcome {
  int64_t updated = 0, deleted = 0, missing = 0;
  uint64_t ticket = 0;  // Storage ticket: reply once durable
};

struct TableInfo {
  TableOptions options;
  RateLimiterCounters counters;
  int64_t size = 0;
  int64_t stale_evicted = 0;
  int64_t learner_version = 0;
  int64_t bytes = 0;
  int64_t batches_logged = 0;
  int64_t claimed = 0;  // items claimed and not yet acknowledged (not in `size`)
  BlockedStats insert_blocked, sample_blocked;
};

class Table {
 public:
  // Opens the table, recovering items, priorities, counters and selector state from `storage`
  // (null: memory only). Fails with DataLoss when the stored state is inconsistent.
  static StatusOr<std::unique_ptr<Table>> Open(TableOptions options, Storage* storage);

  // Non-blocking: nullopt when the rate limiter does not allow it now (`item` is untouched). A
  // remembered idempotency key is answered at once, whatever the rate limiter says.
  StatusOr<std::optional<InsertOutcome>> TryInsert(ItemInput& item);
  // Non-blocking: an empty vector when nothing can be sampled now. `*ticket` (when given): the
  // Storage ticket to reply after (the sample's write, or for a sample that only counts, the
  // latest write of an item it returns; see above).
  StatusOr<std::vector<SampledItem>> TrySample(const SampleOptions& options,
                                               uint64_t* ticket = nullptr);

  // Blocking: wait for the rate limiter until `deadline` (DeadlineExceeded) or Cancel()
  // (Cancelled). Both return once what they did is durable.
  StatusOr<InsertOutcome> Insert(ItemInput item, Deadline deadline);
  StatusOr<std::vector<SampledItem>> Sample(const SampleOptions& options, Deadline deadline);

  // All-or-nothing: every priority is validated first; keys no longer present are skipped and
  // counted; the rest is written in one batch. Does not wait for durability (outcome.ticket).
  StatusOr<UpdateOutcome> UpdatePriorities(const std::vector<std::pair<uint64_t, double>>& updates,
                                           const std::vector<uint64_t>& deletes);
  // Advances the learner version (never backwards) and evicts items outside the window; returns
  // how many were evicted. `*ticket` as for TrySample.
  StatusOr<int64_t> SetLearnerVersion(int64_t version, uint64_t* ticket = nullptr);
  // Deletes the items `claimant` (any session) claimed for batch steps <= through_step; returns
  // how many. `*ticket` as for TrySample.
  StatusOr<int64_t> Acknowledge(const std::string& claimant, int64_t through_step,
                                uint64_t* ticket = nullptr);

  // Wakes every waiter with Cancelled; later blocking calls fail at once.
  void Cancel();
  // Records how long a call parked outside the table (the replay actor) waited.
  void RecordBlocked(BlockedOp op, double start_unix_seconds, double blocked_seconds);

  TableInfo Info() const;
  const std::string& name() const { return options_.name; }
  std::vector<BlockedCall> RecentBlockedCalls() const { return blocked_.Recent(); }
  // The learner-batch log, oldest first.
  StatusOr<std::vector<BatchLogEntry>> ReadBatchLog() const;
  // Every live item's key and state, in key order (tests and tools); claimed items are not live.
  std::vector<std::pair<uint64_t, ItemState>> Items() const;
  // Every claimed item's key and claim, in key order.
  std::vector<std::pair<uint64_t, ClaimRecord>> Claims() const;
  Storage* storage() const { return storage_; }

 private:
  struct Item {
    ItemState state;
    // Memory-only tables keep the payload here; with storage it is read back on sample.
    std::shared_ptr<const std::vector<std::string>> trajectories;
    int64_t bytes = 0;
    // The write that last changed what a sample shows of the item (its insert or a priority
    // update; 0 once recovered: durable): a sample that only counts replies after it.
    uint64_t ticket = 0;
  };

  struct Claimed {
    Item item;
    ClaimRecord claim;
  };

  struct Remembered {
    uint64_t seq = 0;
    IdempotencyRecord record;
    uint64_t ticket = 0;  // of the write that stored it (0 once recovered: durable)
  };

  class BlockedTimer;
  Table(TableOptions options, Storage* storage);
  Status Recover();
  int64_t Cost(int64_t tokens) const {
    return options_.count_unit == CountUnit::kTokens ? tokens : 1;
  }
  bool IsStale(int64_t min_policy_version) const {
    return options_.max_staleness >= 0 &&
           state_.learner_version - min_policy_version > options_.max_staleness;
  }
  Status CheckUsable() const;
  Status ValidateInput(const ItemInput& item) const;
  // Removes an item from memory and adds its deletion to `batch`.
  void DeleteLocked(uint64_t key, rocksdb::WriteBatch* batch);
  // The item's payload: its own copy, or read from storage (a failure makes the table unusable).
  StatusOr<std::shared_ptr<const std::vector<std::string>>> PayloadLocked(uint64_t key,
                                                                          const Item& item);
  // Moves a live item to claimed_ and adds its state and claim records to `batch`.
  void ClaimLocked(uint64_t key, ClaimRecord claim, rocksdb::WriteBatch* batch);
  int64_t EvictStaleLocked(rocksdb::WriteBatch* batch);
  // Remembers `out` as the outcome of `item`'s idempotency key (none: nothing), adding the
  // record to `batch` and forgetting the oldest key beyond idempotency_window.
  void RememberLocked(const ItemInput& item, const InsertOutcome& out, rocksdb::WriteBatch* batch);
  // Commits an insert's batch; the remembered outcome learns the write's ticket.
  StatusOr<InsertOutcome> CommitInsert(const ItemInput& item, InsertOutcome out,
                                       rocksdb::WriteBatch* batch);
  void PutTableState(rocksdb::WriteBatch* batch);
  StatusOr<uint64_t> Commit(rocksdb::WriteBatch* batch);
  // The ticket of the latest write to the storage (a call that wrote nothing replies after it).
  uint64_t LastTicket() const { return storage_ != nullptr ? storage_->last_ticket() : 0; }
  Status WaitDurable(uint64_t ticket) const {
    return storage_ != nullptr ? storage_->WaitDurable(ticket) : Status::OK();
  }
  StatusOr<std::vector<SampledItem>> TrySampleLocked(const SampleOptions& options,
                                                     uint64_t* ticket);

  const TableOptions options_;
  Storage* const storage_;
  std::unique_ptr<ItemSelector> sampler_;
  std::unique_ptr<ItemSelector> remover_;
  BlockedTimeLog blocked_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  RateLimiter limiter_;
  TableState state_;
  PhiloxGenerator rng_;
  std::map<uint64_t, Item> items_;                          // live: in the selectors
  std::map<uint64_t, Claimed> claimed_;                     // sampled, kept until acknowledged
  std::set<std::pair<int64_t, uint64_t>> by_version_;       // (min_policy_version, key)
  std::unordered_map<std::string, Remembered> remembered_;  // by idempotency key
  std::map<uint64_t, std::string> remembered_order_;        // seq -> idempotency key
  int64_t bytes_ = 0;
  bool cancelled_ = false;
  Status broken_;  // the storage error that made the table unusable
};

}  // namespace orrery::replay
