#include "learner/rl/weight_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/safetensors.h"

namespace orrery::rl {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "v-00000012.safetensors" -> 12; -1 for anything else.
int64_t VersionOf(const std::string& file) {
  long long v = -1;
  char tail[32] = {0};
  if (std::sscanf(file.c_str(), "v-%lld.%31s", &v, tail) == 2 &&
      std::string(tail) == "safetensors" && file.size() == 2 + 8 + 12) {
    return v;
  }
  return -1;
}

}  // namespace

std::string WeightStore::PathOf(int64_t version) const {
  char name[64];
  std::snprintf(name, sizeof(name), "v-%08lld.safetensors", static_cast<long long>(version));
  return dir_ + "/" + name;
}

StatusOr<PublishTimings> WeightStore::Publish(
    const std::vector<std::pair<std::string, Tensor>>& named, int64_t version) {
  if (version < 0 || version > 99999999) {
    return InvalidArgumentError("weights: version " + std::to_string(version) + " out of range");
  }
  PublishTimings t;
  double start = Now();
  std::vector<std::pair<std::string, Tensor>> copy;
  for (const auto& [name, tensor] : named) {
    copy.emplace_back(name, tensor.Clone());
    t.bytes += static_cast<int64_t>(tensor.nbytes());
  }
  t.snapshot_seconds = Now() - start;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return IoError("weights: cannot create " + dir_ + ": " + ec.message());
  start = Now();
  ORRERY_RETURN_IF_ERROR(
      WriteSafetensors(PathOf(version), copy, {{"policy_version", std::to_string(version)}}));
  t.write_seconds = Now() - start;
  Prune();
  return t;
}

void WeightStore::Prune() const {
  std::error_code ec;
  std::vector<int64_t> versions;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const int64_t v = VersionOf(entry.path().filename().string());
    if (v >= 0) versions.push_back(v);
  }
  std::sort(versions.begin(), versions.end());
  for (size_t i = 0; i + keep_ < versions.size(); ++i) {
    std::filesystem::remove(PathOf(versions[i]), ec);
  }
}

StatusOr<int64_t> WeightStore::Latest() const {
  std::error_code ec;
  int64_t best = -1;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    best = std::max(best, VersionOf(entry.path().filename().string()));
  }
  if (best < 0) return NotFoundError("weights: no published version under " + dir_);
  return best;
}

StatusOr<std::vector<std::pair<std::string, Tensor>>> WeightStore::Load(
    int64_t version, LoadTimings* timings) const {
  const double start = Now();
  ORRERY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(PathOf(version)));
  std::vector<std::pair<std::string, Tensor>> out;
  int64_t bytes = 0;
  for (const std::string& name : file.names()) {
    ORRERY_ASSIGN_OR_RETURN(Tensor t, file.Get(name));
    bytes += static_cast<int64_t>(t.nbytes());
    out.emplace_back(name, t.Clone());
  }
  if (timings != nullptr) {
    timings->read_seconds = Now() - start;
    timings->bytes = bytes;
  }
  return out;
}

}  // namespace orrery::rl
