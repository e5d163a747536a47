#include "learner/comm/rendezvous_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/safetensors.h"

namespace orrery::comm {

StatusOr<std::string> RendezvousFileName(const std::string& prefix, const std::string& generation) {
  const bool safe =
      !generation.empty() && std::all_of(generation.begin(), generation.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
  if (!safe) {
    return InvalidArgumentError("rendezvous: generation '" + generation +
                                "' must be non-empty and made of [A-Za-z0-9._-]");
  }
  return prefix + "-" + generation;
}

Status PublishRendezvousFile(const std::string& dir, const std::string& name,
                             const std::string& value) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("rendezvous: cannot create directory " + dir + ": " + ec.message());
  return WriteFileAtomic(dir + "/" + name, value);
}

StatusOr<std::string> AwaitRendezvousFile(const std::string& dir, const std::string& name,
                                          size_t expected_size, std::chrono::milliseconds timeout) {
  const std::string path = dir + "/" + name;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::string value((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (in.bad()) return IoError("rendezvous: cannot read " + path);
      if (value.size() != expected_size) {
        return DataLossError("rendezvous: " + path + " holds " + std::to_string(value.size()) +
                             " bytes, expected " + std::to_string(expected_size));
      }
      return value;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return DeadlineExceededError("rendezvous: " + path + " did not appear within " +
                                   std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace orrery::comm
