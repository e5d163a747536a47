// A checkpoint asked for over the wire lands only under replay.checkpoint_dir: names are
// accepted, paths that leave the root are refused with one line.
#include "actors/replay/checkpoint_directory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

TEST(CheckpointDirectoryTest, NamesUnderTheRootAreAccepted) {
  EXPECT_EQ(*CheckpointDirectoryUnder("/r/ck", ""), "");
  EXPECT_EQ(*CheckpointDirectoryUnder("/r/ck", "nightly"), "/r/ck/nightly");
  EXPECT_EQ(*CheckpointDirectoryUnder("/r/ck", "2026/12/02"), "/r/ck/2026/12/02");
}

TEST(CheckpointDirectoryTest, PathsLeavingTheRootAreRefused) {
  for (const char* bad :
       {"/etc/cron.d/x", "../../home/x", "a/../../x", "a//b", "./x", "a/", "..", "."}) {
    StatusOr<std::string> dir = CheckpointDirectoryUnder("/r/ck", bad);
    ASSERT_FALSE(dir.ok()) << bad;
    EXPECT_EQ(dir.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(dir.status().message().find(std::string("directory '") + bad + "'"),
              std::string::npos)
        << dir.status().message();
    EXPECT_NE(dir.status().message().find("replay.checkpoint_dir (/r/ck)"), std::string::npos);
  }
}

TEST(CheckpointDirectoryTest, SymbolicLinksBelowTheRootAreRefused) {
  TestDir dir;
  const std::string root = dir.Sub("ck"), outside = dir.Sub("outside");
  std::filesystem::create_directories(root);
  std::filesystem::create_directories(outside);
  ASSERT_EQ(symlink(outside.c_str(), (root + "/escape").c_str()), 0);
  StatusOr<std::string> through = CheckpointDirectoryUnder(root, "escape/x");
  ASSERT_FALSE(through.ok());
  EXPECT_NE(through.status().message().find("symbolic link " + root + "/escape"), std::string::npos)
      << through.status().message();
  EXPECT_FALSE(CheckpointDirectoryUnder(root, "escape").ok());
  EXPECT_EQ(*CheckpointDirectoryUnder(root, "fine/x"), root + "/fine/x");
}

}  // namespace
}  // namespace orrery::replay
