// A fresh temporary directory per test, removed at the end.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace orrery::replay {

class TestDir {
 public:
  TestDir() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("orrery_replay_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TestDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace orrery::replay
