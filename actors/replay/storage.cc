#include "actors/replay/storage.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

#include <chrono>
#include <filesystem>
#include <mutex>

#include "core/logging.h"

namespace orrery::replay {
namespace {

Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  std::string msg = std::string(what) + ": " + s.ToString();
  if (s.IsCorruption()) return DataLossError(msg);
  if (s.IsNotFound()) return NotFoundError(msg);
  if (s.IsInvalidArgument()) return InvalidArgumentError(msg);
  if (s.IsNoSpace()) return ResourceExhaustedError(msg);
  return IoError(msg);
}

StatusOr<rocksdb::CompressionType> ParseCompression(const std::string& name) {
  if (name == "none") return rocksdb::kNoCompression;
  if (name == "snappy") return rocksdb::kSnappyCompression;
  if (name == "lz4") return rocksdb::kLZ4Compression;
  if (name == "zstd") return rocksdb::kZSTD;
  return InvalidArgumentError("replay storage: unknown compression '" + name +
                              "' (expected none, snappy, lz4, zstd)");
}

bool DirectoryEmptyOrMissing(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return true;
  return std::filesystem::is_directory(path, ec) && std::filesystem::is_empty(path, ec);
}

// Fsyncs the directory holding `path`, so that `path`'s own entry is durable.
Status SyncParentDirectory(rocksdb::Env* env, const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  if (parent.empty()) return Status::OK();
  std::unique_ptr<rocksdb::FSDirectory> dir;
  const rocksdb::IOOptions io;
  rocksdb::IOStatus s = env->GetFileSystem()->NewDirectory(parent, io, &dir, nullptr);
  if (s.ok()) s = dir->Fsync(io, nullptr);
  if (s.ok()) s = dir->Close(io, nullptr);
  return FromRocks(s, "syncing directory " + parent);
}

}  // namespace

// RocksDB 7.8 asserts (Debian's build keeps its asserts) when SyncWAL syncs a WAL whose writer
// saw a failed append, and an append can fail on the write path while the syncer is between its
// last look at the error state and SyncWAL's own check. The gate makes that look and the start of
// the sync one step: appends to the database's WAL files run under its mutex and record a
// failure; the syncer takes the mutex (BeginSync), and the mutex is released when its fsync of
// the WAL starts (or by EndSync when SyncWAL syncs nothing), so appends never wait for an fsync.
class WalSyncGate : public rocksdb::FileSystemWrapper {
 public:
  WalSyncGate(const std::shared_ptr<rocksdb::FileSystem>& base, const std::string& db_path)
      : FileSystemWrapper(base), db_dir_(Normal(db_path)) {}

  const char* Name() const override { return "OrreryWalSyncGate"; }

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(fname, options, result, dbg);
    const std::filesystem::path path = Normal(fname);
    if (s.ok() && path.extension() == ".log" && path.parent_path() == db_dir_) {
      *result = std::make_unique<Wal>(std::move(*result), this);
    }
    return s;
  }

  // True with the gate held: no WAL append has failed. False (not held) otherwise.
  bool BeginSync() {
    mu_.lock();
    if (failed_) {
      mu_.unlock();
      return false;
    }
    holding_ = true;
    return true;
  }
  void EndSync() { Release(); }

 private:
  class Wal : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    Wal(std::unique_ptr<rocksdb::FSWritableFile> file, WalSyncGate* gate)
        : FSWritableFileOwnerWrapper(std::move(file)), gate_(gate) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      return gate_->Appending([&] { return target()->Append(data, options, dbg); });
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info,
                             rocksdb::IODebugContext* dbg) override {
      return gate_->Appending([&] { return target()->Append(data, options, info, dbg); });
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                       const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) override {
      return gate_->Appending(
          [&] { return target()->PositionedAppend(data, offset, options, dbg); });
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                       const rocksdb::IOOptions& options,
                                       const rocksdb::DataVerificationInfo& info,
                                       rocksdb::IODebugContext* dbg) override {
      return gate_->Appending(
          [&] { return target()->PositionedAppend(data, offset, options, info, dbg); });
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
      gate_->Release();
      return target()->Sync(options, dbg);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                            rocksdb::IODebugContext* dbg) override {
      gate_->Release();
      return target()->Fsync(options, dbg);
    }

   private:
    WalSyncGate* gate_;
  };

  static std::filesystem::path Normal(const std::string& path) {
    const std::filesystem::path p = std::filesystem::path(path).lexically_normal();
    return p.has_filename() ? p : p.parent_path();  // "db/" names "db"
  }
  template <typename Fn>
  rocksdb::IOStatus Appending(Fn&& append) {
    std::lock_guard<std::mutex> lock(mu_);
    rocksdb::IOStatus s = append();
    if (!s.ok()) failed_ = true;
    return s;
  }
  // Releases the gate if this thread holds it.
  void Release() {
    if (!holding_) return;
    holding_ = false;
    mu_.unlock();
  }

  const std::filesystem::path db_dir_;
  std::mutex mu_;
  bool failed_ = false;  // guarded by mu_
  static thread_local bool holding_;
};

thread_local bool WalSyncGate::holding_ = false;

Storage::Storage(StorageOptions options) : options_(std::move(options)) {}

void Storage::DbCloser::operator()(rocksdb::DB* db) const { delete db; }

StatusOr<std::unique_ptr<Storage>> Storage::Open(const StorageOptions& options) {
  if (options.path.empty()) return InvalidArgumentError("replay storage: empty path");
  ORRERY_ASSIGN_OR_RETURN(rocksdb::CompressionType compression,
                          ParseCompression(options.compression));
  if (!options.restore_from.empty() && DirectoryEmptyOrMissing(options.path)) {
    std::error_code ec;
    if (!std::filesystem::is_directory(options.restore_from, ec) ||
        !std::filesystem::exists(std::filesystem::path(options.restore_from) / "CURRENT", ec)) {
      return NotFoundError("replay storage: checkpoint '" + options.restore_from +
                           "' is not a RocksDB checkpoint directory");
    }
    std::filesystem::create_directories(options.path, ec);
    std::filesystem::copy(options.restore_from, options.path,
                          std::filesystem::copy_options::recursive, ec);
    if (ec) {
      return IoError("replay storage: copying checkpoint '" + options.restore_from + "' to '" +
                     options.path + "': " + ec.message());
    }
    ORRERY_LOG(INFO) << "replay: restored " << options.path << " from checkpoint "
                     << options.restore_from;
  }
  if (const std::filesystem::path parent = std::filesystem::path(options.path).parent_path();
      !parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return IoError("replay storage: creating " + parent.string() + ": " + ec.message());
  }
  std::unique_ptr<Storage> storage(new Storage(options));
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.compression = compression;
  db_options.max_background_jobs = 2;
  db_options.write_buffer_size = static_cast<size_t>(options.write_buffer_bytes);
  db_options.max_write_buffer_number = 2;
  rocksdb::BlockBasedTableOptions table_options;
  table_options.block_cache = rocksdb::NewLRUCache(static_cast<size_t>(options.block_cache_bytes));
  // Index and filter blocks are charged to the cache too, so the cache bounds what reads hold.
  table_options.cache_index_and_filter_blocks = true;
  db_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options));
  rocksdb::Env* base = options.env != nullptr ? options.env : rocksdb::Env::Default();
  storage->gate_ = std::make_shared<WalSyncGate>(base->GetFileSystem(), options.path);
  storage->env_ = rocksdb::NewCompositeEnv(storage->gate_);
  db_options.env = storage->env_.get();
  rocksdb::DB* db = nullptr;
  ORRERY_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::Open(db_options, options.path, &db), "opening " + options.path));
  storage->db_.reset(db);
  ORRERY_RETURN_IF_ERROR(SyncParentDirectory(db_options.env, options.path));
  if (!options.sync_each_write)
    storage->syncer_ = std::thread([s = storage.get()] { s->SyncLoop(); });
  return storage;
}

Storage::~Storage() {
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    stopping_ = true;
  }
  sync_cv_.notify_all();
  if (syncer_.joinable()) syncer_.join();
  if (db_) {
    // After a failed write or sync the WAL writer is in error: RocksDB must not be asked to sync
    // it again (7.8 asserts on that).
    if (!options_.sync_each_write && sync_error_.ok()) (void)SyncWal();
    db_->Close().PermitUncheckedError();
  }
}

StatusOr<uint64_t> Storage::Write(rocksdb::WriteBatch* batch) {
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_each_write;
  if (options_.sync_each_write) {
    // Durable on return; concurrent writers share fsyncs through RocksDB's own write groups.
    Status s = FromRocks(db_->Write(wo, batch), "replay storage write");
    if (!s.ok()) Fail(s);
    ORRERY_RETURN_IF_ERROR(s);
    return uint64_t{0};
  }
  uint64_t ticket = 0;
  Status s;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    s = FromRocks(db_->Write(wo, batch), "replay storage write");
    if (s.ok()) ticket = ++written_;
  }
  if (!s.ok()) {
    Fail(s);  // not under write_mu_: the syncer takes sync_mu_ before write_mu_
    return s;
  }
  sync_cv_.notify_all();
  return ticket;
}

void Storage::Fail(const Status& error) {
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    if (sync_error_.ok()) sync_error_ = error;
  }
  sync_cv_.notify_all();
}

Status Storage::SyncWal() {
  if (!gate_->BeginSync()) return IoError("replay storage WAL sync: a write to the WAL failed");
  rocksdb::Status s = db_->SyncWAL();
  gate_->EndSync();
  return FromRocks(s, "replay storage WAL sync");
}

void Storage::SyncLoop() {
  std::unique_lock<std::mutex> lock(sync_mu_);
  while (true) {
    if (!sync_error_.ok()) {  // a failed write or sync: the WAL must not be synced again
      if (on_durable_) on_durable_();
      sync_cv_.wait(lock, [&] { return stopping_; });
      return;
    }
    uint64_t target;
    {
      std::lock_guard<std::mutex> wl(write_mu_);
      target = written_;
    }
    if (target > durable_.load()) {
      // The interval runs from the start of one fsync to the start of the next: sleeping a full
      // interval after a slow fsync would only add latency (measured: +1 ms per insert at 64 KB).
      const auto next_sync =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.group_commit_ms);
      lock.unlock();
      Status s = SyncWal();
      lock.lock();
      if (!s.ok()) {
        sync_error_ = s;
        ORRERY_LOG(ERROR) << sync_error_.message();
      } else {
        durable_.store(target, std::memory_order_release);
      }
      sync_cv_.notify_all();
      if (on_durable_) on_durable_();
      if (stopping_) return;
      sync_cv_.wait_until(lock, next_sync, [&] { return stopping_; });
      continue;
    }
    if (stopping_) return;
    sync_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] {
      std::lock_guard<std::mutex> wl(write_mu_);
      return stopping_ || written_ > durable_.load();
    });
  }
}

Status Storage::error() const {
  std::lock_guard<std::mutex> lock(sync_mu_);
  return sync_error_;
}

uint64_t Storage::last_ticket() const {
  std::lock_guard<std::mutex> lock(write_mu_);
  return written_;
}

void Storage::SetDurableListener(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(sync_mu_);
  on_durable_ = std::move(fn);
}

Status Storage::WaitDurable(uint64_t ticket) {
  if (durable_.load(std::memory_order_acquire) >= ticket) return Status::OK();
  std::unique_lock<std::mutex> lock(sync_mu_);
  sync_cv_.wait(lock, [&] { return durable_.load() >= ticket || !sync_error_.ok() || stopping_; });
  if (durable_.load() >= ticket) return Status::OK();
  if (!sync_error_.ok()) return sync_error_;
  return CancelledError("replay storage: closing before the write was synced");
}

StatusOr<std::optional<std::string>> Storage::Get(std::string_view key) const {
  std::string value;
  rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  ORRERY_RETURN_IF_ERROR(FromRocks(s, "replay storage read"));
  return std::optional<std::string>(std::move(value));
}

Status Storage::ScanPrefix(
    std::string_view prefix,
    const std::function<Status(std::string_view, std::string_view)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const rocksdb::Slice p(prefix.data(), prefix.size());
  for (it->Seek(p); it->Valid() && it->key().starts_with(p); it->Next()) {
    ORRERY_RETURN_IF_ERROR(fn(std::string_view(it->key().data(), it->key().size()),
                              std::string_view(it->value().data(), it->value().size())));
  }
  return FromRocks(it->status(), "replay storage scan");
}

Status Storage::Checkpoint(const std::string& directory) {
  std::error_code ec;
  if (std::filesystem::exists(directory, ec)) {
    return AlreadyExistsError("replay checkpoint: '" + directory + "' already exists");
  }
  const auto parent = std::filesystem::path(directory).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  rocksdb::Checkpoint* raw = nullptr;
  ORRERY_RETURN_IF_ERROR(
      FromRocks(rocksdb::Checkpoint::Create(db_.get(), &raw), "replay checkpoint"));
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  // No memtable flush (log_size_for_flush = max): the live WAL is copied instead, so writers
  // never wait for the checkpoint. RocksDB fsyncs the checkpoint's files and directory but not
  // its entry in the parent directory.
  ORRERY_RETURN_IF_ERROR(FromRocks(checkpoint->CreateCheckpoint(directory, UINT64_MAX),
                                   "replay checkpoint to " + directory));
  return SyncParentDirectory(db_->GetEnv(), directory);
}

}  // namespace orrery::replay
