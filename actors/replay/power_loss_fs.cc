#include "actors/replay/power_loss_fs.h"

#include <algorithm>
#include <filesystem>

namespace orrery::replay {
namespace {

namespace fs = std::filesystem;
using rocksdb::IOStatus;

IOStatus PowerOff() { return IOStatus::IOError("simulated power loss: the power is off"); }

IOStatus NotModelled(const char* call) {
  return IOStatus::NotSupported(std::string(call) + " is not modelled by PowerLossFileSystem");
}

// An absolute, lexically normal path without a trailing '/': one spelling per file.
std::string Normalize(const std::string& path) {
  std::error_code ec;
  std::string s = fs::absolute(fs::path(path), ec).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string Parent(const std::string& path) { return fs::path(path).parent_path().string(); }

// `path` with its leading `from` replaced by `to` when `path` is `from` or lies below it.
bool Rebase(std::string* path, const std::string& from, const std::string& to) {
  if (path->compare(0, from.size(), from) != 0) return false;
  if (path->size() != from.size() && (*path)[from.size()] != '/') return false;
  *path = to + path->substr(from.size());
  return true;
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

}  // namespace

class PowerLossFileSystem::File : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  File(std::unique_ptr<rocksdb::FSWritableFile> file, PowerLossFileSystem* fs,
       std::shared_ptr<FileState> state)
      : FSWritableFileOwnerWrapper(std::move(file)), fs_(fs), state_(std::move(state)) {}

  IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                  rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    IOStatus s = target()->Append(data, options, dbg);
    if (s.ok()) Wrote(SizeNow() + data.size());
    return s;
  }
  IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                  const rocksdb::DataVerificationInfo& info,
                  rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    IOStatus s = target()->Append(data, options, info, dbg);
    if (s.ok()) Wrote(SizeNow() + data.size());
    return s;
  }
  IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                            const rocksdb::IOOptions& options,
                            rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    IOStatus s = target()->PositionedAppend(data, offset, options, dbg);
    if (s.ok()) Wrote(offset + data.size());
    return s;
  }
  IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                            const rocksdb::IOOptions& options,
                            const rocksdb::DataVerificationInfo& info,
                            rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    IOStatus s = target()->PositionedAppend(data, offset, options, info, dbg);
    if (s.ok()) Wrote(offset + data.size());
    return s;
  }
  IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& options,
                    rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    IOStatus s = target()->Truncate(size, options, dbg);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(fs_->mu_);
      state_->size = size;
      state_->synced = std::min(state_->synced, size);
    }
    return s;
  }
  IOStatus Close(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();  // the descriptor is closed by the destructor
    return target()->Close(options, dbg);
  }
  IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    const uint64_t at = SizeNow();
    IOStatus s = target()->Sync(options, dbg);
    if (s.ok()) SyncedUpTo(at);
    return s;
  }
  IOStatus Fsync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    const uint64_t at = SizeNow();
    IOStatus s = target()->Fsync(options, dbg);
    if (s.ok()) SyncedUpTo(at);
    return s;
  }

 private:
  uint64_t SizeNow() {
    std::lock_guard<std::mutex> lock(fs_->mu_);
    return state_->size;
  }
  void Wrote(uint64_t end) {
    std::lock_guard<std::mutex> lock(fs_->mu_);
    state_->size = std::max(state_->size, end);
  }
  void SyncedUpTo(uint64_t size) {
    std::lock_guard<std::mutex> lock(fs_->mu_);
    state_->synced = std::max(state_->synced, size);
  }

  PowerLossFileSystem* fs_;
  std::shared_ptr<FileState> state_;
};

class PowerLossFileSystem::Directory : public rocksdb::FSDirectoryWrapper {
 public:
  Directory(std::unique_ptr<rocksdb::FSDirectory> dir, PowerLossFileSystem* fs, std::string path)
      : FSDirectoryWrapper(std::move(dir)), fs_(fs), path_(std::move(path)) {}

  IOStatus Fsync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
    if (!fs_->Mutate()) return PowerOff();
    IOStatus s = FSDirectoryWrapper::Fsync(options, dbg);
    if (s.ok()) fs_->DirectorySynced(path_);
    return s;
  }
  IOStatus FsyncWithDirOptions(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg,
                               const rocksdb::DirFsyncOptions& dir_options) override {
    if (!fs_->Mutate()) return PowerOff();
    IOStatus s = FSDirectoryWrapper::FsyncWithDirOptions(options, dbg, dir_options);
    if (s.ok()) fs_->DirectorySynced(path_);
    return s;
  }

 private:
  PowerLossFileSystem* fs_;
  std::string path_;
};

PowerLossFileSystem::PowerLossFileSystem(const std::shared_ptr<rocksdb::FileSystem>& base)
    : FileSystemWrapper(base) {}

void PowerLossFileSystem::CutPower() { CutPowerAfter(0); }

void PowerLossFileSystem::CutPowerAfter(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  countdown_ = n;
  if (n == 0) powered_ = false;
}

bool PowerLossFileSystem::powered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return powered_;
}

uint64_t PowerLossFileSystem::mutations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mutations_;
}

bool PowerLossFileSystem::Mutate() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!powered_) return false;
  if (countdown_ > 0 && --countdown_ == 0) {
    powered_ = false;
    return false;
  }
  ++mutations_;
  return true;
}

Status PowerLossFileSystem::RestorePower() {
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ec;
  for (const auto& [path, state] : files_) {
    if (!Exists(path) || fs::file_size(path, ec) <= state->synced) continue;
    fs::resize_file(path, state->synced, ec);
    if (ec) return IoError("power-loss fs: truncating " + path + ": " + ec.message());
  }
  for (auto it = new_entries_.rbegin(); it != new_entries_.rend(); ++it) {
    fs::remove_all(it->path, ec);
    if (ec) return IoError("power-loss fs: removing " + it->path + ": " + ec.message());
    if (it->prior.empty()) continue;
    fs::rename(it->prior, it->path, ec);
    if (ec) return IoError("power-loss fs: restoring " + it->path + ": " + ec.message());
  }
  files_.clear();
  new_entries_.clear();
  countdown_ = 0;
  powered_ = true;
  return Status::OK();
}

bool PowerLossFileSystem::IsNewLocked(const std::string& path) const {
  return std::any_of(new_entries_.begin(), new_entries_.end(),
                     [&](const NewEntry& e) { return e.path == path; });
}

void PowerLossFileSystem::AddNewEntryLocked(const std::string& path, std::string prior) {
  new_entries_.push_back({path, std::move(prior)});
}

std::shared_ptr<PowerLossFileSystem::FileState> PowerLossFileSystem::TrackLocked(
    const std::string& path, uint64_t durable_size) {
  auto state = std::make_shared<FileState>();
  state->size = state->synced = durable_size;
  files_[path] = state;
  return state;
}

void PowerLossFileSystem::DirectorySynced(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ec;
  std::erase_if(new_entries_, [&](const NewEntry& e) {
    if (Parent(e.path) != dir) return false;
    if (!e.prior.empty()) {
      fs::remove(e.prior, ec);
      files_.erase(e.prior);
    }
    return true;
  });
}

void PowerLossFileSystem::WrapFile(std::shared_ptr<FileState> state,
                                   std::unique_ptr<rocksdb::FSWritableFile>* file) {
  *file = std::make_unique<File>(std::move(*file), this, std::move(state));
}

IOStatus PowerLossFileSystem::NewWritableFile(const std::string& fname,
                                              const rocksdb::FileOptions& options,
                                              std::unique_ptr<rocksdb::FSWritableFile>* result,
                                              rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  const std::string path = Normalize(fname);
  const bool existed = Exists(path);
  IOStatus s = target()->NewWritableFile(fname, options, result, dbg);
  if (!s.ok()) return s;
  std::shared_ptr<FileState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!existed) AddNewEntryLocked(path);
    state = TrackLocked(path, 0);  // opened with O_TRUNC: empty until synced
  }
  WrapFile(std::move(state), result);
  return s;
}

IOStatus PowerLossFileSystem::ReopenWritableFile(const std::string& fname,
                                                 const rocksdb::FileOptions& options,
                                                 std::unique_ptr<rocksdb::FSWritableFile>* result,
                                                 rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  const std::string path = Normalize(fname);
  const bool existed = Exists(path);
  IOStatus s = target()->ReopenWritableFile(fname, options, result, dbg);
  if (!s.ok()) return s;
  std::error_code ec;
  const uint64_t size = existed ? fs::file_size(path, ec) : 0;
  std::shared_ptr<FileState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!existed) AddNewEntryLocked(path);
    auto it = files_.find(path);
    state = it != files_.end() ? it->second : TrackLocked(path, ec ? 0 : size);
  }
  WrapFile(std::move(state), result);
  return s;
}

IOStatus PowerLossFileSystem::ReuseWritableFile(const std::string&, const std::string&,
                                                const rocksdb::FileOptions&,
                                                std::unique_ptr<rocksdb::FSWritableFile>*,
                                                rocksdb::IODebugContext*) {
  return NotModelled("ReuseWritableFile");
}

IOStatus PowerLossFileSystem::NewRandomRWFile(const std::string&, const rocksdb::FileOptions&,
                                              std::unique_ptr<rocksdb::FSRandomRWFile>*,
                                              rocksdb::IODebugContext*) {
  return NotModelled("NewRandomRWFile");
}

IOStatus PowerLossFileSystem::NewDirectory(const std::string& name,
                                           const rocksdb::IOOptions& options,
                                           std::unique_ptr<rocksdb::FSDirectory>* result,
                                           rocksdb::IODebugContext* dbg) {
  IOStatus s = target()->NewDirectory(name, options, result, dbg);
  if (s.ok()) *result = std::make_unique<Directory>(std::move(*result), this, Normalize(name));
  return s;
}

IOStatus PowerLossFileSystem::DeleteFile(const std::string& fname,
                                         const rocksdb::IOOptions& options,
                                         rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  IOStatus s = target()->DeleteFile(fname, options, dbg);
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    files_.erase(Normalize(fname));
  }
  return s;
}

IOStatus PowerLossFileSystem::Truncate(const std::string& fname, size_t size,
                                       const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  IOStatus s = target()->Truncate(fname, size, options, dbg);
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = files_.find(Normalize(fname)); it != files_.end()) {
      it->second->size = std::min<uint64_t>(it->second->size, size);
      it->second->synced = std::min<uint64_t>(it->second->synced, size);
    }
  }
  return s;
}

IOStatus PowerLossFileSystem::CreateDir(const std::string& dirname,
                                        const rocksdb::IOOptions& options,
                                        rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  IOStatus s = target()->CreateDir(dirname, options, dbg);
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    AddNewEntryLocked(Normalize(dirname));
  }
  return s;
}

IOStatus PowerLossFileSystem::CreateDirIfMissing(const std::string& dirname,
                                                 const rocksdb::IOOptions& options,
                                                 rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  const std::string path = Normalize(dirname);
  const bool existed = Exists(path);
  IOStatus s = target()->CreateDirIfMissing(dirname, options, dbg);
  if (s.ok() && !existed) {
    std::lock_guard<std::mutex> lock(mu_);
    AddNewEntryLocked(path);
  }
  return s;
}

IOStatus PowerLossFileSystem::DeleteDir(const std::string& dirname,
                                        const rocksdb::IOOptions& options,
                                        rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  return target()->DeleteDir(dirname, options, dbg);  // only empty directories: nothing tracked
}

IOStatus PowerLossFileSystem::RenameFile(const std::string& src, const std::string& target_name,
                                         const rocksdb::IOOptions& options,
                                         rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  const std::string from = Normalize(src), to = Normalize(target_name);
  std::lock_guard<std::mutex> lock(mu_);  // renames are rare: keep the bookkeeping in one step
  const bool src_new = IsNewLocked(from);
  const bool add_entry = src_new && !IsNewLocked(to);
  std::string prior;
  std::error_code ec;
  if (add_entry && Exists(to) && !fs::is_directory(to, ec)) {
    // Keep the replaced file's contents: the rename may not survive the power cut.
    prior = to + ".power-loss-prior-" + std::to_string(++priors_made_);
    IOStatus s = target()->LinkFile(to, prior, options, dbg);
    if (!s.ok()) return s;
    if (auto it = files_.find(to); it != files_.end()) {
      files_[prior] = it->second;
      files_.erase(it);
    }
  }
  IOStatus s = target()->RenameFile(src, target_name, options, dbg);
  if (!s.ok()) {
    if (!prior.empty()) {
      if (auto it = files_.find(prior); it != files_.end()) {
        files_[to] = it->second;
        files_.erase(it);
      }
      fs::remove(prior, ec);
    }
    return s;
  }
  // Whatever was at `to` is replaced; whatever was at or below `from` is now at or below `to`.
  std::erase_if(files_, [&](const auto& f) {
    std::string p = f.first;
    return Rebase(&p, to, to);
  });
  std::map<std::string, std::shared_ptr<FileState>> moved;
  std::erase_if(files_, [&](const auto& f) {
    std::string p = f.first;
    if (!Rebase(&p, from, to)) return false;
    moved[p] = f.second;
    return true;
  });
  files_.merge(moved);
  for (NewEntry& e : new_entries_) {
    if (e.path != from) Rebase(&e.path, from, to);  // `from` itself stays: it is gone now
    Rebase(&e.prior, from, to);
  }
  if (add_entry) AddNewEntryLocked(to, std::move(prior));
  return s;
}

IOStatus PowerLossFileSystem::LinkFile(const std::string& src, const std::string& target_name,
                                       const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) {
  if (!Mutate()) return PowerOff();
  IOStatus s = target()->LinkFile(src, target_name, options, dbg);
  if (s.ok()) {
    const std::string from = Normalize(src), to = Normalize(target_name);
    std::lock_guard<std::mutex> lock(mu_);
    AddNewEntryLocked(to);
    if (auto it = files_.find(from); it != files_.end()) files_[to] = it->second;  // one inode
  }
  return s;
}

std::unique_ptr<rocksdb::Env> NewPowerLossEnv(const std::shared_ptr<PowerLossFileSystem>& fs) {
  return rocksdb::NewCompositeEnv(fs);
}

}  // namespace orrery::replay
