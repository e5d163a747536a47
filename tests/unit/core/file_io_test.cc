#include "core/file_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/safetensors.h"

namespace orrery {
namespace {

TEST(FileIoTest, ReadsBackExactlyTheBytesWritten) {
  const std::string path = testing::TempDir() + "/file_io_" + std::to_string(getpid());
  std::string bytes = "line one\n";
  bytes.push_back('\0');  // embedded NUL and non-ASCII bytes survive
  bytes += "\xff\xfe tail";
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, bytes);
  std::remove(path.c_str());
}

TEST(FileIoTest, MissingFileIsNotFoundNamingThePath) {
  StatusOr<std::string> read = ReadFileToString("/nonexistent/orrery/file.toml");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find("/nonexistent/orrery/file.toml"), std::string::npos);
}

}  // namespace
}  // namespace orrery
