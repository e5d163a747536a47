// The GPU PolicyBackend (rollout/gpu_model_backend.h) against the CPU one (rollout/model_backend.h)
// over mixed feeds (prefills and batched single tokens, slots in any order), and LoadWeights
// keeping every slot's cache: after new weights both continue from the old context alike. Shared
// by the unit test on the ops' CPU twins (tests/unit/rollout/gpu_backend_cpu_test.cc) and the GPU
// test (tests/gpu/gpu_inference_test.cc); f32 on both sides.
#pragma once

#include <gtest/gtest.h>

#include "rollout/gpu_model_backend.h"
#include "rollout/model_backend.h"
#include "tests/gpu/gpu_inference_check.h"

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

}  // namespace orrery::rollout_check
