// The RL actors' durable state and config: the learner's batch log (round trip, damage refused,
// dropping what a checkpoint covers), the learner start file, the launch manifest and [rl], the
// evaluation's JSON (per family, and files written before families were counted).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "actors/rl/batch_log.h"
#include "actors/rl/learner_rendezvous.h"
#include "actors/rl/policy_eval.h"
#include "actors/rl/rl_config.h"
#include "actors/rl/rl_run.h"
#include "actors/rl/task_cursor.h"
#include "core/file_io.h"
#include "core/safetensors.h"

namespace orrery::rl_actors {
namespace {

std::string TempDir(const std::string& name) {
  const std::string dir =
      testing::TempDir() + "/orrery_rl_state_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(BatchLogTest, RoundTripsGroupsWithArbitraryBytes) {
  const std::string dir = TempDir("roundtrip");
  BatchLog log(dir + "/batches");
  std::string binary("\0\x01\xff payload", 11);
  std::vector<EncodedGroup> groups = {{7, {"a", binary, ""}}, {9, {}}, {11, {"zz"}}};
  ASSERT_TRUE(log.Save(3, groups).ok());
  auto back = log.Load(3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[0].group_id, 7u);
  EXPECT_EQ((*back)[0].trajectories, groups[0].trajectories);
  EXPECT_TRUE((*back)[1].trajectories.empty());
  EXPECT_EQ((*back)[2].trajectories, groups[2].trajectories);
  EXPECT_EQ(log.Load(4).status().code(), StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(BatchLogTest, DamagedFilesAreRefusedNotMisread) {
  const std::string dir = TempDir("damaged");
  BatchLog log(dir);
  ASSERT_TRUE(log.Save(1, {{5, {"trajectory bytes"}}}).ok());
  const std::string path = dir + "/batch-00000001.bin";
  std::string whole = *ReadFileToString(path);
  // Truncated by one byte, a flipped magic, and trailing garbage: each one DataLoss.
  for (const std::string& bad :
       {whole.substr(0, whole.size() - 1), "X" + whole.substr(1), whole + "extra"}) {
    ASSERT_TRUE(WriteFileAtomic(path, bad).ok());
    auto loaded = log.Load(1);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss) << loaded.status().ToString();
  }
  std::filesystem::remove_all(dir);
}

TEST(BatchLogTest, DropThroughKeepsOnlyLaterVersions) {
  const std::string dir = TempDir("drop");
  BatchLog log(dir);
  for (int v = 1; v <= 5; ++v) ASSERT_TRUE(log.Save(v, {{static_cast<uint64_t>(v), {"x"}}}).ok());
  ASSERT_TRUE(log.DropThrough(3).ok());
  for (int v = 1; v <= 3; ++v) EXPECT_EQ(log.Load(v).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(log.Load(4).ok());
  EXPECT_TRUE(log.Load(5).ok());
  std::filesystem::remove_all(dir);
}

TEST(LearnerStartTest, FollowersTakeOnlyAStartTheyHaveNotUsed) {
  const std::string dir = TempDir("start");
  Cancellation stop;
  // Nothing written yet: a follower times out rather than hanging.
  auto none = AwaitLearnerStart(dir, "", stop, std::chrono::milliseconds(100));
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);
  auto first = PublishLearnerStart(dir, "/run/rl/checkpoints/step-00000004");
  ASSERT_TRUE(first.ok());
  auto seen = AwaitLearnerStart(dir, "", stop, std::chrono::milliseconds(1000));
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->generation, first->generation);
  EXPECT_EQ(seen->checkpoint, "/run/rl/checkpoints/step-00000004");
  // The same generation again is a start this rank already used: it waits for a new one.
  auto again = AwaitLearnerStart(dir, first->generation, stop, std::chrono::milliseconds(100));
  EXPECT_EQ(again.status().code(), StatusCode::kDeadlineExceeded);
  auto second = PublishLearnerStart(dir, "");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->generation, first->generation);
  auto next = AwaitLearnerStart(dir, first->generation, stop, std::chrono::milliseconds(1000));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->checkpoint, "");
  std::filesystem::remove_all(dir);
}

TEST(RlRunTest, ManifestOverridesTheConfigAndSyncTurnsOffDynamicSampling) {
  const std::string dir = TempDir("manifest");
  RlRunPaths paths(dir);
  RlConfig config;
  EXPECT_EQ(ResolveRlConfig(config, paths).status().code(), StatusCode::kInvalidArgument);
  config.init = "/from/config";
  auto plain = ResolveRlConfig(config, paths);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->init, "/from/config");
  EXPECT_TRUE(plain->trainer.skip_uniform_groups);
  ASSERT_TRUE(WriteLaunchManifest(paths, {"/from/launcher", true, 17}).ok());
  auto resolved = ResolveRlConfig(config, paths);
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(resolved->init, "/from/launcher");
  EXPECT_TRUE(resolved->sync);
  EXPECT_EQ(resolved->steps, 17);
  EXPECT_FALSE(resolved->trainer.skip_uniform_groups);
  std::filesystem::remove_all(dir);
}

TEST(RlConfigTest, BadValuesFailNamingTheKey) {
  struct Case {
    std::string text, key;
  };
  for (const Case& c : std::vector<Case>{
           {"[rl]\ngroup_size = 0\n", "rl.group_size"},
           {"[rl]\nsteps = -1\n", "rl.steps"},
           {"[rl.rollout]\ntop_p = 1.5\n", "rl.rollout.top_p"},
           {"[rl.learner]\nadvantage = \"ppo\"\n", "rl.learner.advantage"},
           {"[rl.learner]\nkl_coef = 0.1\n", "rl.learner.kl_coef"},
           {"[rl]\nstep = 3\n", "rl.step"},
           {"[rl.learner]\nppo_epochs = 0\n", "rl.learner.ppo_epochs"},
           {"[rl.learner]\nminibatches = 0\n", "rl.learner.minibatches"},
           // 8 groups of 8 samples cannot fill 65 minibatches.
           {"[rl.learner]\nminibatches = 65\n", "rl.learner.minibatches"},
           {"[rl.rollout]\nenv = \"cloud\"\n", "rl.rollout.env"},
           // Remote without servers: neither endpoints nor an env role in [fleet].
           {"[rl.rollout]\nenv = \"remote\"\n", "rl.rollout.env"},
           {"[rl.rollout]\nenv_endpoints = [\"tcp://h:1\"]\n", "rl.rollout.env_endpoints"},
       }) {
    auto doc = ConfigDocument::ParseString(c.text, "rl.toml");
    ASSERT_TRUE(doc.ok());
    ConfigTable root = doc->root();
    ReadRlConfig(root);
    Status s = doc->Finish();
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_NE(s.message().find(c.key), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("rl.toml"), std::string::npos) << s.message();
  }
}

TEST(RlConfigTest, EnvWorkersAndRemoteEnvironments) {
  auto doc = ConfigDocument::ParseString(
      "[rl.rollout]\nslots = 12\nenv = \"remote\"\n"
      "[rl.learner]\nppo_epochs = 2\nminibatches = 4\n"
      "[[fleet.roles]]\nrole = \"env\"\n",
      "rl.toml");
  ASSERT_TRUE(doc.ok());
  ConfigTable root = doc->root();
  RlConfig c = ReadRlConfig(root);
  Status finished = doc->Finish();
  ASSERT_TRUE(finished.ok()) << finished.message();
  EXPECT_EQ(c.agent.env_workers, 12);  // one per slot
  EXPECT_TRUE(c.remote_env);
  EXPECT_TRUE(c.env_endpoints.empty());  // the fleet's env workers
  EXPECT_EQ(c.trainer.ppo_epochs, 2);
  EXPECT_EQ(c.trainer.minibatches, 4);
}

// A restarted instance re-issues the groups in flight when it died; one that was issued three times
// without ever being stored (the instance died each time: a crash on that group) is dropped and
// counted, so the fleet's restart budget is not spent on it.
TEST(PolicyEvalResultTest, JsonRoundTripsFamiliesAndReadsOlderFiles) {
  PolicyEvalResult r;
  r.episodes = 10;
  r.passed = 4;
  r.mean_reward = 0.4;
  r.tool_call_episode_ratio = 0.5;
  r.seconds = 1.5;
  r.families["calc/d2"] = FamilyEvalResult{6, 3, 4};
  r.families["calc/d3"] = FamilyEvalResult{4, 1, 1};
  StatusOr<PolicyEvalResult> back = PolicyEvalResult::FromJson(r.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->episodes, 10);
  EXPECT_EQ(back->passed, 4);
  ASSERT_EQ(back->families.size(), 2u);
  EXPECT_EQ(back->families.at("calc/d2").passed, 3);
  EXPECT_EQ(back->families.at("calc/d3").with_tools, 1);
  EXPECT_DOUBLE_EQ(back->families.at("calc/d2").pass_rate(), 0.5);
  // An eval_before.json of an earlier launch: no "families".
  StatusOr<PolicyEvalResult> old = PolicyEvalResult::FromJson(
      R"({"episodes":2,"passed":1,"pass_rate":0.5,"mean_reward":0.5,)"
      R"("tool_call_episode_ratio":1,"format_error_ratio":0,"mean_generated_tokens":9,"seconds":1})");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_TRUE(old->families.empty());
  EXPECT_EQ(PolicyEvalResult::FromJson("{\"episodes\": 1}").status().code(), StatusCode::kDataLoss);
}

TEST(TaskCursorTest, AGroupThatKeepsEndingTheInstanceIsDropped) {
  const std::string path = TempDir("cursor") + "/task_cursor";
  // Instance 1 of 2: tasks 1, 3, 5, ...
  for (int life = 0; life < 3; ++life) {
    TaskCursor c(path, 1, 2);
    ASSERT_TRUE(c.Load().ok());
    EXPECT_EQ(*c.Issue(), 1u) << "life " << life;  // dies with task 1 in flight
    EXPECT_EQ(c.dropped(), 0);
  }
  TaskCursor c(path, 1, 2);
  ASSERT_TRUE(c.Load().ok());
  EXPECT_EQ(*c.Issue(), 3u);  // task 1 is dropped
  EXPECT_EQ(c.dropped(), 1);
  EXPECT_EQ(c.committed(), 1u);
  EXPECT_EQ(*c.Issue(), 5u);
  ASSERT_TRUE(c.Acknowledge(5).ok());
  ASSERT_TRUE(c.Acknowledge(3).ok());
  EXPECT_EQ(c.committed(), 3u);
  // A task that was stored is never counted again; a fresh life starts at the cursor.
  TaskCursor next(path, 1, 2);
  ASSERT_TRUE(next.Load().ok());
  EXPECT_EQ(*next.Issue(), 7u);
  EXPECT_EQ(next.dropped(), 0);
}

TEST(TaskCursorTest, DamagedAttemptsAreRefused) {
  const std::string path = TempDir("cursor_damaged") + "/task_cursor";
  ASSERT_TRUE(WriteFileAtomic(path + ".attempts", "1 x\n").ok());
  TaskCursor c(path, 0, 1);
  EXPECT_EQ(c.Load().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace orrery::rl_actors
