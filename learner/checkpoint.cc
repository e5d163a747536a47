#include "learner/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/safetensors.h"

namespace orrery {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "step-";

// FNV-1a 64 over a file's bytes (mmap'ed), with its size.
StatusOr<std::pair<uint64_t, int64_t>> HashFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ErrnoError("open " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return ErrnoError("stat " + path, errno);
  }
  uint64_t h = 1469598103934665603ull;
  if (st.st_size > 0) {
    void* p = ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return ErrnoError("mmap " + path, errno);
    }
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (off_t i = 0; i < st.st_size; ++i) h = (h ^ b[i]) * 1099511628211ull;
    ::munmap(p, st.st_size);
  }
  ::close(fd);
  return std::make_pair(h, static_cast<int64_t>(st.st_size));
}

std::string StepDirName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%08lld", kPrefix, static_cast<long long>(step));
  return buf;
}

bool IsCheckpointName(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() != std::string(kPrefix).size() + 8) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> CheckpointNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && IsCheckpointName(n)) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

int FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc;
}

}  // namespace

StatusOr<std::string> WriteCheckpoint(const std::string& checkpoints_dir,
                                      const CheckpointContents& c, int64_t keep) {
  std::error_code ec;
  fs::create_directories(checkpoints_dir, ec);
  if (ec) return IoError("create " + checkpoints_dir + ": " + ec.message());
  const std::string final_dir = checkpoints_dir + "/" + StepDirName(c.state.step);
  const std::string tmp_dir = final_dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return IoError("create " + tmp_dir + ": " + ec.message());

  ORRERY_RETURN_IF_ERROR(WriteSafetensors(tmp_dir + "/model.safetensors", c.model,
                                          {{"step", std::to_string(c.state.step)}}));
  ORRERY_RETURN_IF_ERROR(WriteSafetensors(tmp_dir + "/optimizer.safetensors", c.optimizer,
                                          {{"step", std::to_string(c.state.optimizer_step)}}));
  for (const auto& [name, contents] : c.files) {
    ORRERY_RETURN_IF_ERROR(WriteFileAtomic(tmp_dir + "/" + name, contents));
  }
  nlohmann::ordered_json j;
  j["format"] = "orrery-checkpoint-v1";
  j["step"] = c.state.step;
  j["stage"] = c.state.stage;
  j["stage_steps"] = c.state.stage_steps;
  j["tokens"] = c.state.tokens;
  j["cursor"] = {{"epoch", c.state.cursor.epoch},
                 {"position", c.state.cursor.position},
                 {"doc_offset", c.state.cursor.doc_offset}};
  j["seed"] = c.state.seed;
  j["optimizer_step"] = c.state.optimizer_step;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    ORRERY_ASSIGN_OR_RETURN(auto hs, HashFile(tmp_dir + "/" + f));
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hs.first));
    j["files"][f] = {{"fnv1a64", hex}, {"bytes", hs.second}};
  }
  ORRERY_RETURN_IF_ERROR(WriteFileAtomic(tmp_dir + "/trainer.json", j.dump(2) + "\n"));
  fs::remove_all(final_dir, ec);  // a checkpoint of the same step from an abandoned attempt
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    return ErrnoError("rename " + tmp_dir + " to " + final_dir, errno);
  }
  if (FsyncPath(checkpoints_dir) != 0) return ErrnoError("fsync " + checkpoints_dir, errno);

  std::vector<std::string> names = CheckpointNames(checkpoints_dir);
  for (size_t i = 0; i + keep < names.size(); ++i)
    fs::remove_all(checkpoints_dir + "/" + names[i], ec);
  return final_dir;
}

StatusOr<std::string> LatestCheckpoint(const std::string& checkpoints_dir) {
  std::vector<std::string> names = CheckpointNames(checkpoints_dir);
  if (names.empty()) return NotFoundError("no checkpoint in " + checkpoints_dir);
  return checkpoints_dir + "/" + names.back();
}

StatusOr<std::string> ResolveCheckpointDir(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return NotFoundError("checkpoint " + path + " does not exist");
  }
  if (!fs::is_directory(status)) return NotFoundError("checkpoint " + path + " is not a directory");
  if (fs::exists(path + "/trainer.json", ec)) return path;
  // A step directory without trainer.json is a damaged checkpoint, not a run directory.
  if (IsCheckpointName(fs::path(path).lexically_normal().filename().string())) return path;
  if (fs::is_directory(path + "/checkpoints", ec)) return LatestCheckpoint(path + "/checkpoints");
  return LatestCheckpoint(path);
}

StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointDir(path));
  auto corrupt = [&](const std::string& what) {
    return DataLossError("checkpoint " + dir + " is corrupt: " + what);
  };
  StatusOr<std::string> text = ReadFileToString(dir + "/trainer.json");
  if (!text.ok()) return corrupt("trainer.json is missing");
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "orrery-checkpoint-v1") {
    return corrupt("trainer.json is not an orrery-checkpoint-v1 record");
  }
  LoadedCheckpoint out;
  out.path = dir;
  try {
    out.state.step = j.at("step").get<int64_t>();
    out.state.stage = j.at("stage").get<int64_t>();
    out.state.stage_steps = j.at("stage_steps").get<int64_t>();
    out.state.tokens = j.at("tokens").get<int64_t>();
    out.state.cursor.epoch = j.at("cursor").at("epoch").get<uint64_t>();
    out.state.cursor.position = j.at("cursor").at("position").get<int64_t>();
    out.state.cursor.doc_offset = j.at("cursor").at("doc_offset").get<int64_t>();
    out.state.seed = j.at("seed").get<uint64_t>();
    out.state.optimizer_step = j.at("optimizer_step").get<int64_t>();
    for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
      const std::string want = j.at("files").at(f).at("fnv1a64").get<std::string>();
      const int64_t bytes = j.at("files").at(f).at("bytes").get<int64_t>();
      StatusOr<std::pair<uint64_t, int64_t>> hs = HashFile(dir + "/" + f);
      if (!hs.ok()) return corrupt(std::string(f) + " is missing");
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hs->first));
      if (hs->second != bytes) {
        return corrupt(std::string(f) + " has " + std::to_string(hs->second) + " bytes, expected " +
                       std::to_string(bytes));
      }
      if (want != hex) return corrupt(std::string(f) + " does not match its recorded hash");
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(std::string("trainer.json: ") + e.what());
  }
  for (auto [file, target] : {std::pair{"/model.safetensors", &out.model},
                              std::pair{"/optimizer.safetensors", &out.optimizer}}) {
    StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir + file);
    if (!f.ok()) return corrupt(f.status().message());
    for (const std::string& name : f->names()) {
      ORRERY_ASSIGN_OR_RETURN(Tensor t, f->Get(name));
      (*target)[name] = t;
    }
  }
  return out;
}

}  // namespace orrery
