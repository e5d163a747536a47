#include "actors/replay/checkpoint_directory.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

namespace orrery::replay {

StatusOr<std::string> CheckpointDirectoryUnder(const std::string& root,
                                               const std::string& requested) {
  if (requested.empty()) return std::string();
  const auto refuse = [&](const std::string& why) {
    return InvalidArgumentError("replay checkpoint: directory '" + requested + "' " + why +
                                "; a checkpoint is a name under replay.checkpoint_dir (" + root +
                                ")");
  };
  if (requested.front() == '/') return refuse("is absolute");
  if (requested.find('\0') != std::string::npos) return refuse("holds a NUL byte");
  std::filesystem::path at(root);
  size_t begin = 0;
  while (begin <= requested.size()) {
    const size_t end = std::min(requested.find('/', begin), requested.size());
    const std::string name = requested.substr(begin, end - begin);
    if (name.empty() || name == "." || name == "..") {
      return refuse("has a '" + name + "' component");
    }
    at /= name;
    struct stat st;
    if (lstat(at.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return refuse("goes through the symbolic link " + at.string());
    }
    begin = end + 1;
  }
  return at.string();
}

}  // namespace orrery::replay
