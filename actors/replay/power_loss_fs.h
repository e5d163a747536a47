// PowerLossFileSystem: a RocksDB FileSystem for power-loss tests. It passes every call to the
// real file system and remembers what a power cut could take away. CutPower() (or
// CutPowerAfter(n)) makes every later mutating call fail; once everything using the files is
// closed, RestorePower() puts the files in the state the disk may be in after the cut (the
// harshest one the model allows) and turns the power back on.
//
//   auto fs = std::make_shared<PowerLossFileSystem>();
//   std::unique_ptr<rocksdb::Env> env = NewPowerLossEnv(fs);   // StorageOptions::env
//   ... open a DB on env, fs->CutPowerAfter(n), run until a write fails, close the DB ...
//   ORRERY_RETURN_IF_ERROR(fs->RestorePower());                 // then reopen and check
//
// Modelled:
//   - File data. Bytes written through this file system since a file's last successful
//     Sync/Fsync are lost: the file is truncated to its size when that sync *started* (bytes
//     appended while an fsync runs are unsynced). RangeSync, Flush and Close are not syncs. A file
//     opened with NewWritableFile over an existing one counts as empty until synced.
//   - Directory entries. A name created since the last Fsync of its parent directory (a new file,
//     CreateDir/CreateDirIfMissing, LinkFile's target, RenameFile's target when the source was
//     itself new) disappears with everything below it; when such a rename replaced an existing
//     file, that file comes back with its old contents (kept meanwhile by a hard link named
//     `<target>.power-loss-prior-<n>`, removed when the directory is synced).
// Not modelled, i.e. treated as durable at once: deleting a file or directory; renaming a source
// that was already durable (the rename is durable at once); FileSystem::Truncate; torn writes
// inside the synced range; anything done outside this file system (std::filesystem, files that
// existed before: all durable). NewRandomRWFile and ReuseWritableFile are refused (NotSupported)
// so that no write bypasses the model.
//
// A mutating call is an append, a file sync, truncate or close, a creation, rename, link or
// deletion, or a directory fsync. Thread-safe.
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace orrery::replay {

class PowerLossFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit PowerLossFileSystem(
      const std::shared_ptr<rocksdb::FileSystem>& base = rocksdb::FileSystem::Default());

  const char* Name() const override { return "OrreryPowerLossFileSystem"; }

  // Power control.
  void CutPower();
  // The n-th mutating call from now (n >= 1) fails as the first one without power; 0: now.
  void CutPowerAfter(uint64_t n);
  bool powered() const;
  // Mutating calls that went through while powered, since construction.
  uint64_t mutations() const;
  // Drops what the cut lost (above) and turns the power back on; every file then counts as
  // durable. Call only once nothing is using the files (the DB is closed).
  Status RestorePower();

  // The intercepted calls.
  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname,
                                       const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& fname, const std::string& old_fname,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewRandomRWFile(const std::string& fname, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& options,
                                 std::unique_ptr<rocksdb::FSDirectory>* result,
                                 rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& fname, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus Truncate(const std::string& fname, size_t size,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus CreateDir(const std::string& dirname, const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus CreateDirIfMissing(const std::string& dirname,
                                       const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteDir(const std::string& dirname, const rocksdb::IOOptions& options,
                              rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& target,
                               const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus LinkFile(const std::string& src, const std::string& target,
                             const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override;

 private:
  struct FileState {
    uint64_t size = 0;    // bytes written
    uint64_t synced = 0;  // bytes durable
  };
  struct NewEntry {
    std::string path;
    std::string prior;  // a hard link to the durable file this entry replaced, or empty
  };
  class File;
  class Directory;

  // Counts a mutating call; false (and the power is off) when it must fail.
  bool Mutate();
  // The calls' bookkeeping, under mu_.
  bool IsNewLocked(const std::string& path) const;
  void AddNewEntryLocked(const std::string& path, std::string prior = "");
  std::shared_ptr<FileState> TrackLocked(const std::string& path, uint64_t durable_size);
  void DirectorySynced(const std::string& dir);
  // Wraps a freshly opened file.
  void WrapFile(std::shared_ptr<FileState> state, std::unique_ptr<rocksdb::FSWritableFile>* file);

  mutable std::mutex mu_;
  bool powered_ = true;
  uint64_t countdown_ = 0;  // > 0: the power goes off at the countdown_-th mutating call
  uint64_t mutations_ = 0;
  uint64_t priors_made_ = 0;
  std::map<std::string, std::shared_ptr<FileState>> files_;  // files written through here
  std::vector<NewEntry> new_entries_;                        // in creation order
};

// An Env whose file calls go to `fs` (threads and clock: the default Env); it shares `fs`.
std::unique_ptr<rocksdb::Env> NewPowerLossEnv(const std::shared_ptr<PowerLossFileSystem>& fs);

}  // namespace orrery::replay
