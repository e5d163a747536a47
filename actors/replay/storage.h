// Storage: the replay store's RocksDB database, with durable acknowledgement.
//
// Every table mutation is one atomic WriteBatch (item records, payloads and the table's counters
// together), so after a crash the database holds a consistent prefix of the operations. A write
// returns a ticket; it is acknowledged only once durable_ticket() reaches it:
//   - sync_each_write: each batch is written with WAL fsync (ticket durable on return);
//   - group commit: batches are written to the WAL without fsync and a syncer thread fsyncs the
//     WAL, starting fsyncs at most every group_commit_ms (an fsync slower than that is followed
//     at once by the next when writes are waiting), advancing durable_ticket() for all writes
//     before it.
// (A write without fsync already survives kill -9 of the process; fsync makes it survive power
// loss.) The database directory's and a checkpoint's entries in their parent directories are
// fsynced too, so an acknowledged database or checkpoint survives power loss. After a failed
// write or WAL sync the WAL is never synced again (RocksDB 7.8 asserts on that); a gate on the
// WAL's appends makes that hold even for a sync starting while an append fails. Checkpoints
// hard-link SST files and copy the live WAL without flushing, so they never block writers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "core/status.h"

namespace rocksdb {
class DB;
class Env;
class WriteBatch;
}  // namespace rocksdb

namespace orrery::replay {

class WalSyncGate;

struct StorageOptions {
  std::string path;                 // the database directory (created when missing)
  bool sync_each_write = true;      // false: group commit
  int64_t group_commit_ms = 5;      // group commit only: the longest wait between WAL fsyncs
  std::string compression = "lz4";  // none, snappy, lz4, zstd
  std::string restore_from;         // a checkpoint directory copied to `path` when `path` is empty
  // RocksDB's memory: the LRU block cache that sampled payloads are read through, and the size
  // of one memtable (at most two are kept, so writes hold at most twice this much).
  int64_t block_cache_bytes = 256ll << 20;
  int64_t write_buffer_bytes = 64ll << 20;
  rocksdb::Env* env = nullptr;  // RocksDB's file system and threads (tests: power loss); null:
                                // the default. Must outlive the Storage.
};

class Storage {
 public:
  static StatusOr<std::unique_ptr<Storage>> Open(const StorageOptions& options);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Applies `batch` atomically; returns its ticket (0 with sync_each_write: durable already).
  StatusOr<uint64_t> Write(rocksdb::WriteBatch* batch);
  uint64_t durable_ticket() const { return durable_.load(std::memory_order_acquire); }
  // The ticket of the latest write (0 with sync_each_write).
  uint64_t last_ticket() const;
  // The first failed write or WAL sync (OK while none failed): tickets after the durable one
  // will never be durable.
  Status error() const;
  // Blocks until `ticket` is durable (or the syncer failed: that error).
  Status WaitDurable(uint64_t ticket);
  // Group commit: `fn` is called on the syncer thread after every WAL fsync that advanced
  // durable_ticket() (or failed), so an event loop can release its acks at once instead of
  // polling. It must be quick and must not call back into Storage. Pass nullptr to remove it
  // before whatever it refers to goes away.
  void SetDurableListener(std::function<void()> fn);

  StatusOr<std::optional<std::string>> Get(std::string_view key) const;
  // Calls fn(key, value) for every key starting with `prefix`, in key order.
  Status ScanPrefix(std::string_view prefix,
                    const std::function<Status(std::string_view, std::string_view)>& fn) const;
  // A consistent copy of the database in `directory` (must not exist). Safe to call while other
  // threads write.
  Status Checkpoint(const std::string& directory);

  const StorageOptions& options() const { return options_; }

 private:
  explicit Storage(StorageOptions options);
  void SyncLoop();
  // Records the first write or sync error: waiters get it, and the WAL is not synced again.
  void Fail(const Status& error);
  // SyncWAL, unless a WAL append has failed (RocksDB 7.8 asserts on syncing such a WAL).
  Status SyncWal();

  StorageOptions options_;
  // RocksDB's Env: options.env's (or the default) file system behind the WAL sync gate.
  std::shared_ptr<WalSyncGate> gate_;
  std::unique_ptr<rocksdb::Env> env_;
  struct DbCloser {
    void operator()(rocksdb::DB* db) const;
  };
  std::unique_ptr<rocksdb::DB, DbCloser> db_;
  mutable std::mutex write_mu_;  // orders tickets like the WAL
  uint64_t written_ = 0;
  std::atomic<uint64_t> durable_{0};

  mutable std::mutex sync_mu_;
  std::condition_variable sync_cv_;   // the syncer waits for writes; waiters for durability
  Status sync_error_;                 // the first failed write or sync
  std::function<void()> on_durable_;  // guarded by sync_mu_
  bool stopping_ = false;
  std::thread syncer_;
};

}  // namespace orrery::replay
