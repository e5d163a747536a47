// Trajectory encoding round-trips exactly; bad column lengths are rejected; the group item
// carries the token count and the oldest model-token policy version.
#include "actors/replay/trajectory.h"

#include <gtest/gtest.h>

namespace orrery::replay {
namespace {

Trajectory Sample(uint64_t group, uint64_t first_version) {
  Trajectory t;
  t.task_id = "task-7";
  t.env_name = "calc";
  t.group_id = group;
  t.seed = 99;
  t.status = TrajectoryStatus::kToolError;
  t.tokens = {1, 2, 3, 4};
  t.logprobs = {0.f, -0.5f, -1.25f, 0.f};
  t.policy_versions = {0, first_version, first_version + 1, 0};
  t.loss_mask = {false, true, true, false};
  t.roles = {TokenRole::kPrompt, TokenRole::kModel, TokenRole::kModel, TokenRole::kTool};
  t.turns = {0, 0, 0, 1};
  t.moe_layers = 2;
  t.top_k = 1;
  t.routed_experts = {1, 2, 3, 4, 5, 6, 7, 8};
  t.tool_calls = {{"calculate", "{\"x\": 1}", "2", 3.5, "boom", 0}};
  t.reward = 0.75;
  t.reward_components = {{"format", 0.25}, {"answer", 0.5}};
  t.timings = {1.0, 2.0, 3.0, 4.0, 10.0};
  return t;
}

TEST(TrajectoryTest, RoundTripsExactly) {
  Trajectory t = Sample(5, 3);
  StatusOr<Trajectory> back = DecodeTrajectory(EncodeTrajectory(t));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->task_id, t.task_id);
  EXPECT_EQ(back->status, t.status);
  EXPECT_EQ(back->tokens, t.tokens);
  EXPECT_EQ(back->logprobs, t.logprobs);
  EXPECT_EQ(back->policy_versions, t.policy_versions);
  EXPECT_EQ(back->loss_mask, t.loss_mask);
  EXPECT_EQ(back->roles, t.roles);
  EXPECT_EQ(back->turns, t.turns);
  EXPECT_EQ(back->routed_experts, t.routed_experts);
  ASSERT_EQ(back->tool_calls.size(), 1u);
  EXPECT_EQ(back->tool_calls[0].error, "boom");
  EXPECT_EQ(back->tool_calls[0].latency_ms, 3.5);
  EXPECT_EQ(back->reward_components, t.reward_components);
  EXPECT_EQ(back->timings.total_seconds, 10.0);
}

TEST(TrajectoryTest, RejectsBadColumnsAndGarbage) {
  Trajectory t = Sample(1, 1);
  t.logprobs.pop_back();
  EXPECT_EQ(ValidateTrajectory(t).code(), StatusCode::kInvalidArgument);
  t = Sample(1, 1);
  t.routed_experts.pop_back();
  EXPECT_FALSE(ValidateTrajectory(t).ok());
  EXPECT_FALSE(DecodeTrajectory("garbage!").ok());
  std::string bytes = EncodeTrajectory(Sample(1, 1));
  EXPECT_FALSE(DecodeTrajectory(bytes.substr(0, bytes.size() / 2 / 8 * 8)).ok());
}

TEST(TrajectoryTest, GroupItem) {
  ItemInput item = GroupItem({Sample(9, 6), Sample(9, 4), Sample(9, 5)}, 2.0);
  EXPECT_EQ(item.group_id, 9u);
  EXPECT_EQ(item.tokens, 12);
  EXPECT_EQ(item.min_policy_version, 4);  // prompt and tool tokens (version 0) do not count
  EXPECT_EQ(item.trajectories.size(), 3u);
  EXPECT_EQ(item.priority, 2.0);
}

}  // namespace
}  // namespace orrery::replay
