// The file rendezvous behind the NCCL communicator (its unique id): names, atomic publication,
// waiting for a value another process publishes, timeouts, and the generation separating groups.
// Also the NCCL factory's option checks, which run before any CUDA call (and so run here).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "learner/comm/nccl_communicator.h"
#include "learner/comm/rendezvous_file.h"

namespace orrery::comm {
namespace {

using std::chrono::milliseconds;

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             (name + "-" + std::to_string(getpid()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(RlCommRendezvous, FileNameCarriesASafeGeneration) {
  EXPECT_EQ(*RendezvousFileName("nccl-unique-id", "gen-3.1_a"), "nccl-unique-id-gen-3.1_a");
  for (const char* bad : {"", "../x", "a/b", "a b", "x\n"}) {
    auto name = RendezvousFileName("nccl-unique-id", bad);
    ASSERT_FALSE(name.ok()) << bad;
    EXPECT_EQ(name.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(name.status().message().find("generation"), std::string::npos);
  }
}

TEST(RlCommRendezvous, AnotherProcessPublishesWhileWeWait) {
  const std::string dir = TempDir("orrery-rdv") + "/store";  // created by the publisher
  std::string value(128, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 7);
  pid_t pid = fork();
  if (pid == 0) {
    std::this_thread::sleep_for(milliseconds(150));
    _exit(PublishRendezvousFile(dir, "id-5", value).ok() ? 0 : 1);
  }
  auto got = AwaitRendezvousFile(dir, "id-5", value.size(), milliseconds(20000));
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
  // No temp files are left beside the published one.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "id-5");
  }
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

TEST(RlCommRendezvous, MissingValueTimesOutNamingTheFile) {
  const std::string dir = TempDir("orrery-rdv-none");
  // Another generation's value is not ours.
  ASSERT_TRUE(PublishRendezvousFile(dir, "id-1", std::string(16, 'x')).ok());
  const auto start = std::chrono::steady_clock::now();
  auto got = AwaitRendezvousFile(dir, "id-2", 16, milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find(dir + "/id-2"), std::string::npos);
  EXPECT_GE(waited, milliseconds(200));
  EXPECT_LT(waited, milliseconds(5000));
  std::filesystem::remove_all(dir);
}

TEST(RlCommRendezvous, WrongSizeIsDataLoss) {
  const std::string dir = TempDir("orrery-rdv-size");
  ASSERT_TRUE(PublishRendezvousFile(dir, "id-0", "short").ok());
  auto got = AwaitRendezvousFile(dir, "id-0", 128, milliseconds(1000));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
  // A republished value replaces the old one.
  ASSERT_TRUE(PublishRendezvousFile(dir, "id-0", std::string(128, 'k')).ok());
  EXPECT_EQ(*AwaitRendezvousFile(dir, "id-0", 128, milliseconds(1000)), std::string(128, 'k'));
  std::filesystem::remove_all(dir);
}

TEST(RlCommRendezvous, NcclRejectsBadOptionsBeforeTouchingCuda) {
  const StatusCode expected =
      NcclAvailable() ? StatusCode::kInvalidArgument : StatusCode::kUnimplemented;
  NcclOptions o;
  o.world_size = 2;
  o.store_dir = "/nonexistent-orrery-dir";
  o.rank = 2;
  EXPECT_EQ(CreateNcclCommunicator(o).status().code(), expected);
  o.rank = 0;
  o.store_dir = "";
  EXPECT_EQ(CreateNcclCommunicator(o).status().code(), expected);
  o.store_dir = "/nonexistent-orrery-dir";
  o.generation = "../up";
  EXPECT_EQ(CreateNcclCommunicator(o).status().code(), expected);
  o.generation = "1";
  o.timeout_ms = 0;
  EXPECT_EQ(CreateNcclCommunicator(o).status().code(), expected);
  o.timeout_ms = 1000;
  o.device = -2;
  EXPECT_EQ(CreateNcclCommunicator(o).status().code(), expected);
}

}  // namespace
}  // namespace orrery::comm
