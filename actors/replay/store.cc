#include "actors/replay/store.h"

#include <chrono>
#include <ctime>
#include <filesystem>

#include "core/logging.h"

namespace orrery::replay {

StatusOr<std::unique_ptr<ReplayStore>> ReplayStore::Open(const ReplayConfig& config) {
  if (config.tables.empty()) return InvalidArgumentError("replay: no tables configured");
  std::unique_ptr<ReplayStore> store(new ReplayStore(config));
  ORRERY_ASSIGN_OR_RETURN(store->storage_, Storage::Open(config.storage));
  for (const TableOptions& options : config.tables) {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<Table> table,
                            Table::Open(options, store->storage_.get()));
    store->tables_[options.name] = std::move(table);
  }
  return store;
}

ReplayStore::~ReplayStore() {
  Cancel();
  tables_.clear();
}

StatusOr<Table*> ReplayStore::Find(const std::string& name) const {
  auto it = tables_.find(name);
  if (it != tables_.end()) return it->second.get();
  std::string known;
  for (const auto& [n, t] : tables_) known += (known.empty() ? "" : ", ") + n;
  return NotFoundError("replay: no table '" + name + "' (tables: " + known + ")");
}

std::vector<Table*> ReplayStore::tables() const {
  std::vector<Table*> out;
  for (const auto& [n, t] : tables_) out.push_back(t.get());
  return out;
}

StatusOr<std::string> ReplayStore::Checkpoint(const std::string& directory) {
  std::string dir = directory;
  if (dir.empty()) {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
        1000;
    dir = (std::filesystem::path(config_.checkpoint_root) /
           (std::string("replay-") + buf + "-" + std::to_string(ms)))
              .string();
  }
  ORRERY_RETURN_IF_ERROR(storage_->Checkpoint(dir));
  ORRERY_LOG(INFO) << "replay: checkpoint written to " << dir;
  return dir;
}

void ReplayStore::Cancel() {
  for (auto& [n, t] : tables_) t->Cancel();
}

}  // namespace orrery::replay
