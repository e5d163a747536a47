// ReplayStore: the tables of one replay store and the RocksDB database they share.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/replay/replay_config.h"
#include "actors/replay/storage.h"
#include "actors/replay/table.h"

namespace orrery::replay {

class ReplayStore {
 public:
  // Opens (or creates, or restores from a checkpoint) the database and recovers every table.
  static StatusOr<std::unique_ptr<ReplayStore>> Open(const ReplayConfig& config);
  ~ReplayStore();

  // NotFound naming the known tables.
  StatusOr<Table*> Find(const std::string& name) const;
  std::vector<Table*> tables() const;
  Storage* storage() const { return storage_.get(); }
  const ReplayConfig& config() const { return config_; }

  // A checkpoint in `directory`, or in a new directory under config().checkpoint_root when empty.
  // Returns the directory. Never blocks inserts or samples.
  StatusOr<std::string> Checkpoint(const std::string& directory);
  // Cancels every table: all blocked calls return Cancelled.
  void Cancel();

 private:
  explicit ReplayStore(ReplayConfig config) : config_(std::move(config)) {}
  ReplayConfig config_;
  std::unique_ptr<Storage> storage_;
  std::map<std::string, std::unique_ptr<Table>> tables_;
};

}  // namespace orrery::replay
