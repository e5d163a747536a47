// The rollout -> replay (Cap'n Proto bytes) -> learner path keeps every token column exact.
#include <gtest/gtest.h>

#include "actors/rl/trajectory_convert.h"

namespace orrery::rl_actors {
namespace {

rollout::Trajectory Sample() {
  rollout::Trajectory t;
  t.task_id = "calc/train/d2/3/4";
  t.env_name = "calc";
  t.group_id = 12;
  t.seed = 3;
  t.status = rollout::EpisodeStatus::kTruncated;
  t.tokens = {4, 8, 15, 16, 23};
  t.logprobs = {0, 0, -0.5f, -1.25f, 0};
  t.policy_versions = {6, 6, 6, 7, 7};
  t.loss_mask = {0, 0, 1, 1, 0};
  t.roles = {rollout::TokenRole::kPrompt, rollout::TokenRole::kPrompt, rollout::TokenRole::kModel,
             rollout::TokenRole::kModel, rollout::TokenRole::kTool};
  t.turns = {0, 0, 0, 0, 1};
  t.moe_layers = 2;
  t.top_k = 1;
  t.routed_experts = {1, 2, 3, 4, 5, 6, 7, 0, 1, 2};
  t.tool_calls.push_back({"calculate", "{\"expression\": \"1+1\"}", "2", 0.5, "", 0});
  t.reward = 1;
  t.reward_components = {{"correct", 1.0}};
  return t;
}

TEST(RlConvert, RolloutThroughReplayBytesToLearner) {
  const rollout::Trajectory t = Sample();
  replay::Trajectory r = ToReplayTrajectory(t);
  ASSERT_TRUE(replay::ValidateTrajectory(r).ok());
  EXPECT_EQ(replay::MinPolicyVersion(r), 6u);
  auto group = DecodeGroup(12, {replay::EncodeTrajectory(r), replay::EncodeTrajectory(r)});
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  ASSERT_EQ(group->samples.size(), 2u);
  const rl::PolicySample& s = group->samples[1];
  EXPECT_EQ(s.tokens, t.tokens);
  EXPECT_EQ(s.behaviour_logprobs, t.logprobs);
  EXPECT_EQ(s.policy_versions, t.policy_versions);
  EXPECT_EQ(s.loss_mask, t.loss_mask);
  EXPECT_EQ(s.routed_experts, t.routed_experts);
  EXPECT_EQ(s.reward, 1.0);
  EXPECT_EQ(s.min_policy_version(), 6);
  auto back = replay::DecodeTrajectory(replay::EncodeTrajectory(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->status, replay::TrajectoryStatus::kTruncated);
  ASSERT_EQ(back->tool_calls.size(), 1u);
  EXPECT_EQ(back->tool_calls[0].result, "2");
}

// Every terminal status survives the replay bytes; the three environment faults reach the learner
// as masked samples (env_fault), the policy's own ends do not.
TEST(RlConvert, EnvironmentFaultsReachTheLearnerMasked) {
  using S = rollout::EpisodeStatus;
  for (S status : {S::kFinished, S::kTruncated, S::kToolError, S::kTimeout, S::kEnvLost}) {
    rollout::Trajectory t = Sample();
    t.status = status;
    auto group = DecodeGroup(12, {replay::EncodeTrajectory(ToReplayTrajectory(t))});
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    EXPECT_EQ(group->samples[0].env_fault, t.env_fault()) << rollout::EpisodeStatusName(status);
    EXPECT_EQ(t.env_fault(), status != S::kFinished && status != S::kTruncated);
    auto back = replay::DecodeTrajectory(replay::EncodeTrajectory(ToReplayTrajectory(t)));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(static_cast<int>(back->status), static_cast<int>(status));
  }
}

TEST(RlConvert, InconsistentColumnsAreRejected) {
  rollout::Trajectory t = Sample();
  t.routed_experts.pop_back();
  EXPECT_FALSE(ToPolicySample(ToReplayTrajectory(t)).ok());
  EXPECT_FALSE(DecodeGroup(1, {"not capnp"}).ok());
}

}  // namespace
}  // namespace orrery::rl_actors
