#include "actors/rl/learner_rendezvous.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/safetensors.h"

namespace orrery::rl_actors {
namespace {

std::string StartPath(const std::string& gloo_dir) { return gloo_dir + "/start.json"; }

StatusOr<LearnerStart> ReadStart(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    return LearnerStart{j.at("generation").get<std::string>(),
                        j.at("checkpoint").get<std::string>()};
  } catch (const std::exception& e) {
    return DataLossError(path + ": " + e.what());
  }
}

}  // namespace

StatusOr<LearnerStart> PublishLearnerStart(const std::string& gloo_dir,
                                           const std::string& checkpoint) {
  std::error_code ec;
  std::filesystem::create_directories(gloo_dir, ec);
  if (ec) return IoError(gloo_dir + ": " + ec.message());
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  LearnerStart start;
  start.generation =
      "g" + std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
  start.checkpoint = checkpoint;
  nlohmann::json j;
  j["generation"] = start.generation;
  j["checkpoint"] = start.checkpoint;
  ORRERY_RETURN_IF_ERROR(WriteFileAtomic(StartPath(gloo_dir), j.dump() + "\n"));
  return start;
}

StatusOr<LearnerStart> AwaitLearnerStart(const std::string& gloo_dir,
                                         const std::string& last_generation,
                                         const Cancellation& stop,
                                         std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string path = StartPath(gloo_dir);
  while (true) {
    StatusOr<LearnerStart> start = ReadStart(path);
    if (start.ok() && start->generation != last_generation) return start;
    if (!start.ok() && start.status().code() != StatusCode::kNotFound) return start.status();
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError(path + ": learner rank 0 wrote no new start within " +
                                   std::to_string(timeout.count()) + " ms");
    }
    if (stop.WaitFor(std::chrono::milliseconds(50))) return CancelledError("stopped");
  }
}

}  // namespace orrery::rl_actors
