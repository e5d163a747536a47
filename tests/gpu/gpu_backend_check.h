// The GPU PolicyBackend (rollout/gpu_model_backend.h) against the CPU one (rollout/model_backend.h)
// over mixed feeds (prefills and batched single tokens, slots in any order), and LoadWeights
// keeping every slot's cache: after new weights both continue from the old context alike; a
// prompt fed once and copied (CopySlot) against separate prefills; and the agent loop's scheduling
// on the GPU backend (rollout/agent_loop.h): shared prompts against separate prefills, and an
// over-subscribed page pool with a token budget against an unconstrained run. Shared by the unit
// test on the ops' CPU twins (tests/unit/rollout/gpu_backend_cpu_test.cc) and the GPU test
// (tests/gpu/gpu_inference_test.cc); f32 on both sides.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "rollout/agent_loop.h"
#include "rollout/gpu_model_backend.h"
#include "rollout/model_backend.h"
#include "tests/gpu/gpu_inference_check.h"
#include "tests/unit/rollout/agent_test_util.h"

namespace orrery::rollout_check {

inline void BackendAcrossWeightUpdate(Device device, double tol) {
  using model::inference_check::Tokens;
  auto host = model::inference_check::HostModel();
  ASSERT_TRUE(host);
  rollout::GpuBackendOptions go;
  go.model.device = device;
  go.model.compute_dtype = DType::kF32;
  go.max_slots = 2;
  go.max_context = 256;
  go.page_size = 8;
  auto gpu = rollout::GpuModelBackend::Create(*host, go);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = rollout::ModelBackend::Create(host.get(), 2, 256);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto feed = [&](const std::vector<int>& slots, const std::vector<std::vector<int32_t>>& t) {
    auto a = (*cpu)->Feed(slots, t);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = (*gpu)->Feed(slots, t);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_LT(kernels::testing::RelRmsError(b->logits, a->logits), tol);
    ASSERT_EQ(a->expert_ids.shape(), b->expert_ids.shape());
    int64_t differing = 0;
    for (int64_t i = 0; i < a->expert_ids.numel(); ++i) {
      differing += a->expert_ids.data<int32_t>()[i] != b->expert_ids.data<int32_t>()[i];
    }
    EXPECT_LE(differing, a->expert_ids.numel() / 100);
  };
  feed({1, 0}, {Tokens(12, 1), Tokens(30, 2)});
  feed({0, 1}, {{5}, {7}});
  feed({1, 0}, {Tokens(5, 4), {8}});  // a second turn beside a decode
  // New weights for both: the host model's, perturbed (the CPU backend reads it in place).
  PhiloxGenerator gen(3, 3);
  for (model::Parameter& p : host->parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      p.value.data<float>()[i] += static_cast<float>(0.02 * gen.Normal());
    }
  }
  ASSERT_TRUE((*gpu)->LoadWeights(rollout::NamedWeights(*host), 7).ok());
  EXPECT_EQ((*gpu)->version(), 7);
  feed({0, 1}, {{9}, Tokens(4, 3)});
  feed({1}, {{11}});
  // Released slots start afresh on both.
  (*cpu)->Release(0);
  (*gpu)->Release(0);
  feed({0}, {Tokens(6, 5)});
  // A bad weight set is refused with its name.
  auto named = rollout::NamedWeights(*host);
  named.pop_back();
  Status s = (*gpu)->LoadWeights(named, 8);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_EQ((*gpu)->version(), 7);
}

// A prompt fed once to the GPU backend's slot 0 and copied to slots 1 and 2 continues as the CPU
// backend's three separate prefills of it: divergent decodes, then a second turn. The copies take
// no free context (pages shared) and each first decode of a slot sharing the partially filled last
// page takes one page (copy-on-write); releasing every slot returns the pool to its start.
inline void BackendCopySlot(Device device, double tol) {
  using model::inference_check::Tokens;
  auto host = model::inference_check::HostModel();
  ASSERT_TRUE(host);
  rollout::GpuBackendOptions go;
  go.model.device = device;
  go.model.compute_dtype = DType::kF32;
  go.max_slots = 3;
  go.max_context = 256;
  go.page_size = 8;
  go.num_pages = 24;
  auto gpu = rollout::GpuModelBackend::Create(*host, go);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto cpu = rollout::ModelBackend::Create(host.get(), 3, 256);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  rollout::PolicyBackend& g = **gpu;
  const int64_t capacity = g.context_capacity();
  EXPECT_EQ(capacity, 24 * 8);
  EXPECT_EQ(g.free_context(), capacity);
  const std::vector<int32_t> prompt = Tokens(13, 21);  // 2 pages, the second holding 5 rows
  EXPECT_EQ(g.FeedCost(0, 13), 16);
  auto want = (*cpu)->Feed({0, 1, 2}, {prompt, prompt, prompt});
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = g.Feed({0}, {prompt});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto row0 = want->logits.Slice(0, 1);
  ASSERT_TRUE(row0.ok());
  EXPECT_LT(kernels::testing::RelRmsError(got->logits, row0->Clone()), tol);
  EXPECT_EQ(g.CopyCost(0), 0);
  ASSERT_TRUE(g.CopySlot(0, 1).ok());
  ASSERT_TRUE(g.CopySlot(0, 2).ok());
  EXPECT_EQ(g.free_context(), capacity - 16) << "copies share the prompt's pages";
  EXPECT_EQ(g.FeedCost(1, 1), 8) << "copy-on-write of the shared, partially filled page";
  EXPECT_EQ(g.FeedCost(1, 3), 8);
  EXPECT_EQ(g.FeedCost(1, 4), 16);
  auto feed = [&](const std::vector<int>& slots, const std::vector<std::vector<int32_t>>& t) {
    auto a = (*cpu)->Feed(slots, t);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = g.Feed(slots, t);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_LT(kernels::testing::RelRmsError(b->logits, a->logits), tol);
    ASSERT_EQ(a->expert_ids.shape(), b->expert_ids.shape());
    int64_t differing = 0;
    for (int64_t i = 0; i < a->expert_ids.numel(); ++i) {
      differing += a->expert_ids.data<int32_t>()[i] != b->expert_ids.data<int32_t>()[i];
    }
    EXPECT_LE(differing, a->expert_ids.numel() / 100);
  };
  for (int step = 0; step < 6; ++step) {
    const std::vector<int32_t> t = Tokens(3, 40 + step);  // a different token per slot
    feed({0, 1, 2}, {{t[0]}, {t[1]}, {t[2]}});
    if (::testing::Test::HasFatalFailure()) return;
    if (step == 0) {
      // Slots 0 and 1 copied the shared page; slot 2 then held it alone and wrote in place.
      EXPECT_EQ(g.free_context(), capacity - 16 - 2 * 8);
    }
  }
  feed({2, 0}, {Tokens(9, 5), Tokens(3, 6)});  // second turns of different lengths
  for (int s = 0; s < 3; ++s) g.Release(s);
  EXPECT_EQ(g.free_context(), capacity) << "released slots return every page";
}

inline rollout::AgentOptions AgentCheckOptions() {
  rollout::AgentOptions o;
  o.max_turn_tokens = 8;
  o.max_episode_tokens = 480;
  o.seed = 13;
  return o;
}

inline StatusOr<std::unique_ptr<rollout::GpuModelBackend>> AgentBackend(model::Model& host,
                                                                        Device device,
                                                                        int64_t num_pages) {
  rollout::GpuBackendOptions go;
  go.model.device = device;
  go.model.compute_dtype = DType::kF32;
  go.max_slots = 4;
  go.max_context = 480;
  go.page_size = 16;
  go.num_pages = num_pages;
  return rollout::GpuModelBackend::Create(host, go);
}

// The agent loop on the GPU backend with a group's prompt prefilled once and copied to its
// siblings against every episode prefilling its own: the same trajectories, the copy saving
// (G - 1) x (prompt - 1) fed tokens per group, and the pool back at its start when idle.
inline void AgentSharedPromptsMatchSeparatePrefills(Device device) {
  rollout::CalcFixture f;
  auto host = model::inference_check::HostModel(4096, false, 320);
  ASSERT_TRUE(host);
  auto shared = AgentBackend(*host, device, 0);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  auto separate = AgentBackend(*host, device, 0);
  ASSERT_TRUE(separate.ok()) << separate.status().ToString();
  rollout::AgentOptions o = AgentCheckOptions();
  rollout::AgentStats with, without;
  // Two groups of two on four slots: every Reset is back before the first feed, so each group
  // shares.
  const auto a = rollout::RunAgent(shared->get(), f, o, 2, 2, &with, [] {});
  o.share_prompts = false;
  const auto b = rollout::RunAgent(separate->get(), f, o, 2, 2, &without, [] {});
  ASSERT_EQ(a.size(), 2u);
  rollout::ExpectSameTrajectories(a, b, 1e-4);
  int64_t saved = 0;  // the second episode's prompt but its last token, per group
  for (const auto& g : a) {
    const rollout::Trajectory& t = g.trajectories[1];
    int64_t n = 0;
    while (n < t.size() && t.roles[static_cast<size_t>(n)] != rollout::TokenRole::kModel) ++n;
    saved += n - 1;
  }
  std::printf("shared prompts: %lld prompt tokens not fed (%lld fed, %lld separately)\n",
              static_cast<long long>(with.prompt_tokens_shared),
              static_cast<long long>(with.tokens_fed), static_cast<long long>(without.tokens_fed));
  EXPECT_GT(saved, 200);
  EXPECT_EQ(with.prompt_tokens_shared, saved);
  EXPECT_EQ(without.prompt_tokens_shared, 0);
  EXPECT_EQ(with.tokens_fed + with.prompt_tokens_shared, without.tokens_fed);
  EXPECT_EQ((*shared)->free_context(), (*shared)->context_capacity());
}

// The agent loop on a page pool that holds about one episode and a token budget of 24 tokens a
// step, against the same groups on a pool that holds them all without a budget: episodes wait for
// pages (in the queue, before a feed, or preempted and fed again), none is truncated or failed,
// every trajectory is the unconstrained run's, no step feeds more than the budget, and the pool's
// free pages return to their start.
inline void AgentOverSubscribedPoolWaits(Device device) {
  rollout::CalcFixture f;
  auto host = model::inference_check::HostModel(4096, false, 320);
  ASSERT_TRUE(host);
  auto roomy = AgentBackend(*host, device, 0);
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  rollout::AgentOptions o = AgentCheckOptions();
  rollout::AgentStats free_stats, tight_stats;
  const auto want = rollout::RunAgent(roomy->get(), f, o, 3, 2, &free_stats, [] {});
  ASSERT_EQ(want.size(), 3u);
  int64_t longest = 0;
  for (const auto& g : want) {
    for (const auto& t : g.trajectories) longest = std::max(longest, t.size());
  }
  const int64_t pages = (longest + 15) / 16 + 1;  // one episode and a page
  auto tight = AgentBackend(*host, device, pages);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  model::GpuInferenceState& state = (*tight)->state();
  ASSERT_EQ(state.free_pages(), pages);
  o.max_step_tokens = 24;
  rollout::CountingBackend counted(tight->get());
  const auto got =
      rollout::RunAgent(&counted, f, o, 3, 2, &tight_stats, [&] { counted.EndStep(); });
  rollout::ExpectSameTrajectories(got, want, 1e-4);
  std::printf(
      "over-subscribed pool of %lld pages: %lld admission waits, %lld context waits, %lld "
      "preemptions, %lld chunked feeds, %lld steps (%lld unconstrained)\n",
      static_cast<long long>(pages), static_cast<long long>(tight_stats.admission_waits),
      static_cast<long long>(tight_stats.context_waits),
      static_cast<long long>(tight_stats.preemptions),
      static_cast<long long>(tight_stats.chunked_feeds), static_cast<long long>(tight_stats.steps),
      static_cast<long long>(free_stats.steps));
  std::printf("largest step: %lld tokens (budget 24), %lld steps mixed decodes and chunks\n",
              static_cast<long long>(counted.max_step_tokens),
              static_cast<long long>(counted.mixed_steps));
  EXPECT_GT(tight_stats.admission_waits + tight_stats.context_waits, 0);
  EXPECT_GT(tight_stats.chunked_feeds, 0);
  EXPECT_EQ(tight_stats.episodes_finished, 6);
  EXPECT_LE(counted.max_step_tokens, 24);
  EXPECT_GT(counted.mixed_steps, 0) << "prefill chunks beside decodes";
  EXPECT_EQ(state.free_pages(), pages) << "the pool's free pages return to their start";
}

}  // namespace orrery::rollout_check
