#include "actors/rl/batch_log.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/file_io.h"
#include "core/safetensors.h"

namespace orrery::rl_actors {
namespace {

constexpr char kMagic[8] = {'O', 'R', 'B', 'A', 'T', 'C', 'H', '1'};

void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

bool GetU64(std::string_view& in, uint64_t* v) {
  if (in.size() < 8) return false;
  std::memcpy(v, in.data(), 8);
  in.remove_prefix(8);
  return true;
}

}  // namespace

std::string BatchLog::PathOf(int64_t version) const {
  char name[32];
  std::snprintf(name, sizeof(name), "batch-%08lld.bin", static_cast<long long>(version));
  return dir_ + "/" + name;
}

Status BatchLog::Save(int64_t version, const std::vector<EncodedGroup>& groups) const {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return IoError(dir_ + ": " + ec.message());
  std::string out(kMagic, sizeof(kMagic));
  PutU64(out, groups.size());
  for (const EncodedGroup& g : groups) {
    PutU64(out, g.group_id);
    PutU64(out, g.trajectories.size());
    for (const std::string& t : g.trajectories) {
      PutU64(out, t.size());
      out += t;
    }
  }
  return WriteFileAtomic(PathOf(version), out);
}

StatusOr<std::vector<EncodedGroup>> BatchLog::Load(int64_t version) const {
  const std::string path = PathOf(version);
  StatusOr<std::string> read = ReadFileToString(path);
  if (!read.ok()) return read.status();
  const std::string& bytes = *read;
  std::string_view in(bytes);
  auto damaged = [&path] { return DataLossError(path + ": damaged batch log"); };
  if (in.size() < sizeof(kMagic) || std::memcmp(in.data(), kMagic, sizeof(kMagic)) != 0) {
    return damaged();
  }
  in.remove_prefix(sizeof(kMagic));
  uint64_t n = 0;
  if (!GetU64(in, &n) || n > in.size()) return damaged();
  std::vector<EncodedGroup> groups(n);
  for (EncodedGroup& g : groups) {
    uint64_t count = 0;
    if (!GetU64(in, &g.group_id) || !GetU64(in, &count) || count > in.size()) return damaged();
    g.trajectories.resize(count);
    for (std::string& t : g.trajectories) {
      uint64_t size = 0;
      if (!GetU64(in, &size) || size > in.size()) return damaged();
      t.assign(in.data(), size);
      in.remove_prefix(size);
    }
  }
  if (!in.empty()) return damaged();
  return groups;
}

Status BatchLog::DropThrough(int64_t version) const {
  std::error_code ec;
  if (!std::filesystem::exists(dir_, ec)) return Status::OK();
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    long long v = 0;
    if (std::sscanf(name.c_str(), "batch-%lld.bin", &v) == 1 && v <= version) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  if (ec) return IoError(dir_ + ": " + ec.message());
  return Status::OK();
}

}  // namespace orrery::rl_actors
