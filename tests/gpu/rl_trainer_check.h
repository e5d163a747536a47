// The RL trainer on the GPU model against the RL trainer on the host model, its oracle, shared by
// the unit test on the ops' CPU twins (tests/unit/learner/rl_gpu_trainer_cpu_test.cc) and the GPU
// test on CUDA (tests/gpu/rl_gpu_test.cc): the same groups through both for several updates of
// several optimizer steps each (ppo_epochs x minibatches = 4, a learning rate that makes the PPO
// clip act from the second step on), several micro-batches per minibatch, off-policy behaviour
// log-probabilities (weights truncated at the cap), forced routing (R3), Quantile Balancing.
// Checked: the loss statistics of every update, the routing agreement, the expert load, and the
// weights after the updates; then a GPU-path checkpoint restores exactly into a fresh GPU trainer
// and loads into a host trainer.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/philox.h"
#include "learner/rl/rl_trainer.h"
#include "model/gpu/gpu_model.h"
#include "tests/gpu/gpu_model_check.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::rl::trainer_check {

// Tolerances of one comparison. The loss sums add O(1) terms of both signs over the tokens, so
// they are compared per token; a near-tie between experts or at a clip boundary may go the other
// way on one side, so the clip count and the expert load allow a few tokens.
struct Tolerances {
  double per_token;  // |Δ| / tokens of loss, entropy and weight sums of an update
  double relative;   // of the ratio sum (large ratios dominate it) and of the grad norm
  double weights;    // relative RMS of every parameter after the updates
  // The same for the parameters whose value after a few AdamW steps is mostly the steps
  // themselves and whose gradient is a sum that cancels: the zero-initialised AttnRes
  // pseudo-queries (*_res_proj: each element moves by about ±lr with the sign of its gradient, so
  // an element whose gradient is within rounding of zero moves the other way on the other side)
  // and A_log (one number per head summed over every token and channel).
  double sign_sensitive_weights;
  double clipped_tokens;  // |Δ clipped| in tokens
  double load_tokens;     // |Δ load| of an expert in tokens (one token: E / (k tokens))
};

// `groups` groups of `g` samples: a prompt of 5..20 random tokens, then an answer of 3..8 model
// tokens whose behaviour log-probabilities are the host model's own plus noise (so π_prox / μ
// ranges over [e^-1, e]: weights above the cap are truncated); rewards 0..3 (never uniform).
inline std::vector<PolicyGroup> RandomGroups(model::Model& m, int groups, int g, uint64_t seed) {
  const model::ModelConfig& c = m.config();
  const int64_t layers = c.num_moe_layers(), k = c.moe.top_k, v = c.vocab_size;
  PhiloxGenerator rng(seed, 0);
  std::vector<PolicyGroup> out(groups);
  for (int gi = 0; gi < groups; ++gi) {
    out[gi].group_id = static_cast<uint64_t>(gi);
    for (int i = 0; i < g; ++i) {
      PolicySample s;
      const int64_t prompt = 5 + static_cast<int64_t>(rng.UniformInt(16));
      const int64_t n = prompt + 3 + static_cast<int64_t>(rng.UniformInt(6));
      for (int64_t t = 0; t < n; ++t) s.tokens.push_back(static_cast<int32_t>(rng.UniformInt(v)));
      model::Batch b;
      b.tokens = Tensor::FromVector<int32_t>({1, n}, s.tokens);
      model::ForwardCache cache;
      Tensor logits = m.Forward(b, &cache).value();
      const Tensor ids = cache.StackedExpertIds();
      for (int64_t t = 0; t < n; ++t) {
        const bool model_token = t >= prompt;
        s.loss_mask.push_back(model_token ? 1 : 0);
        s.policy_versions.push_back(0);
        float mu = 0.0f;
        if (model_token) {
          const float* z = logits.data<float>() + (t - 1) * v;
          double mx = z[0], sum = 0;
          for (int64_t j = 1; j < v; ++j) mx = std::max(mx, double(z[j]));
          for (int64_t j = 0; j < v; ++j) sum += std::exp(z[j] - mx);
          mu = static_cast<float>(z[s.tokens[t]] - mx - std::log(sum) + 0.5 * rng.Normal());
        }
        s.behaviour_logprobs.push_back(mu);
        for (int64_t l = 0; l < layers; ++l) {
          for (int64_t j = 0; j < k; ++j) {
            s.routed_experts.push_back(
                static_cast<uint16_t>(ids.data<int32_t>()[(l * n + t) * k + j]));
          }
        }
      }
      s.reward = static_cast<double>((gi + i) % 4);
      out[gi].samples.push_back(std::move(s));
    }
  }
  return out;
}

inline RlTrainerOptions Options() {
  RlTrainerOptions o;
  o.lr = 1e-2;
  o.adamw.weight_decay = 0.01;
  // AdamW moves an element by about lr whatever its gradient's size, so an element whose gradient
  // is rounding noise on both sides would move by up to 2 lr differently; eps 1e-6 (far below
  // the gradients that matter, ~1e-3) keeps such elements still on both sides.
  o.adamw.eps = 1e-6;
  o.max_staleness = -1;
  o.temperature = 0.8;
  o.micro_batch_tokens = 60;  // several micro-batches per minibatch
  o.ppo_epochs = 2;
  o.minibatches = 2;
  o.max_grad_norm = 0.5;  // clipping acts
  o.loss.is_cap = 2.0;
  o.loss.entropy_coef = 0.01;
  return o;
}

// Trains `updates` updates on both paths from the same initial weights and compares them.
inline void CompareTrainers(Device device, DType dtype, int updates, const Tolerances& tol) {
  StatusOr<model::ModelConfig> config = model::gpu_check::EveryLayerKind();
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto host = model::Model::Create(*config, 41, DType::kF32);
  auto twin = model::Model::Create(*config, 41, DType::kF32);  // the GPU model's source
  ASSERT_TRUE(host.ok() && twin.ok());
  model::GpuModelOptions go;
  go.device = device;
  go.compute_dtype = dtype;
  auto gpu = model::GpuModel::FromHost(**twin, go);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto comm = comm::MakeLocalCommunicator();
  const RlTrainerOptions o = Options();
  auto ht = RlTrainer::Create(host->get(), comm.get(), o);
  auto gt = RlTrainer::Create(gpu->get(), comm.get(), o);
  ASSERT_TRUE(ht.ok()) << ht.status().ToString();
  ASSERT_TRUE(gt.ok()) << gt.status().ToString();
  double clipped = 0, grad_clipped = 0;
  for (int u = 0; u < updates; ++u) {
    // Groups sampled from the host model's current policy (the same for both trainers).
    const std::vector<PolicyGroup> groups = RandomGroups(**host, 3, 4, 70 + u);
    auto hs = (*ht)->Step(groups);
    auto gs = (*gt)->Step(groups);
    ASSERT_TRUE(hs.ok()) << hs.status().ToString();
    ASSERT_TRUE(gs.ok()) << gs.status().ToString();
    ASSERT_TRUE(hs->updated && gs->updated);
    EXPECT_EQ(gs->version, hs->version);
    EXPECT_EQ(gs->optimizer_steps, 4);
    const double tokens = hs->loss.tokens;
    EXPECT_EQ(gs->loss.tokens, tokens);
    EXPECT_NEAR(gs->loss.clipped, hs->loss.clipped, tol.clipped_tokens) << "update " << u;
    EXPECT_NEAR(gs->loss.loss_sum, hs->loss.loss_sum, tol.per_token * tokens) << "update " << u;
    EXPECT_NEAR(gs->loss.entropy_sum, hs->loss.entropy_sum, tol.per_token * tokens) << u;
    EXPECT_NEAR(gs->loss.ratio_sum, hs->loss.ratio_sum, tol.relative * hs->loss.ratio_sum) << u;
    EXPECT_NEAR(gs->loss.is_weight_sum, hs->loss.is_weight_sum, tol.per_token * tokens) << u;
    EXPECT_NEAR(gs->grad_norm, hs->grad_norm, tol.relative * hs->grad_norm) << "update " << u;
    ASSERT_EQ(gs->routing_agreement.size(), hs->routing_agreement.size());
    ASSERT_EQ(gs->expert_load.size(), hs->expert_load.size());
    const double one_token = static_cast<double>(config->moe.num_experts) /
                             (config->moe.top_k * static_cast<double>(hs->tokens));
    for (size_t l = 0; l < hs->expert_load.size(); ++l) {
      // Agreement over the first epoch's positions (~k tokens of 2k per position compared).
      EXPECT_NEAR(gs->routing_agreement[l], hs->routing_agreement[l],
                  tol.load_tokens / static_cast<double>(hs->tokens))
          << "layer " << l << ", update " << u;
      for (size_t e = 0; e < hs->expert_load[l].size(); ++e) {
        EXPECT_NEAR(gs->expert_load[l][e], hs->expert_load[l][e], tol.load_tokens * one_token)
            << "layer " << l << ", expert " << e << ", update " << u;
      }
    }
    std::printf("update %d: loss %.8g / %.8g, clipped %.0f of %.0f, grad norm %.6g / %.6g\n", u,
                hs->loss.loss_sum, gs->loss.loss_sum, hs->loss.clipped, hs->loss.tokens,
                hs->grad_norm, gs->grad_norm);
    clipped += hs->loss.clipped;
    grad_clipped += hs->grad_norm > o.max_grad_norm ? 1 : 0;
  }
  EXPECT_GT(clipped, 0) << "the PPO clip never acted: the comparison proves less";
  EXPECT_GT(grad_clipped, 0) << "gradient clipping never acted";
  model::Model& h = **host;
  double worst = 0;
  std::string worst_name;
  for (const model::GpuParameter& p : (*gpu)->parameters()) {
    const Tensor* want = nullptr;
    for (const model::Parameter& hp : h.parameters()) {
      if (hp.name == p.name) want = &hp.value;
    }
    ASSERT_NE(want, nullptr) << p.name;
    const double err = kernels::testing::RelRmsError(p.master.To(Device::Cpu()).value(), *want);
    if (err > worst) {
      worst = err;
      worst_name = p.name;
    }
    const bool sign_sensitive = p.name.ends_with("_res_proj") || p.name.ends_with(".A_log");
    EXPECT_LT(err, sign_sensitive ? tol.sign_sensitive_weights : tol.weights) << p.name;
  }
  std::printf("weights after %d updates: worst rel RMS %.3g (%s)\n", updates, worst,
              worst_name.c_str());

  // A checkpoint of the GPU path: exact restore into a fresh GPU trainer (the next update is the
  // same), and the host trainer loads it (host names and shapes).
  const auto dir =
      std::filesystem::temp_directory_path() / ("orrery-rl-gpu-ckpt-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE((*gt)->SaveCheckpoint(dir.string(), 1).ok());
  auto other = model::Model::Create(*config, 5, DType::kF32);
  auto gpu2 = model::GpuModel::FromHost(**other, go);
  ASSERT_TRUE(gpu2.ok());
  auto gt2 = RlTrainer::Create(gpu2->get(), comm.get(), o);
  ASSERT_TRUE(gt2.ok());
  ASSERT_TRUE((*gt2)->RestoreLatest(dir.string()).ok());
  EXPECT_EQ((*gt2)->version(), updates);
  const std::vector<PolicyGroup> groups = RandomGroups(**host, 3, 4, 99);
  auto a = (*gt)->Step(groups);
  auto b = (*gt2)->Step(groups);
  ASSERT_TRUE(a.ok() && b.ok());
  // Both paths are deterministic (the CPU twins by construction; the CUDA kernels sum across
  // blocks in fixed orders and pin their cuBLASLt algorithms: docs/pretraining.md,
  // "Determinism"), so the restored trainer takes the same step bit for bit.
  EXPECT_EQ(a->loss.loss_sum, b->loss.loss_sum);
  EXPECT_EQ(a->grad_norm, b->grad_norm);
  auto ht2 = RlTrainer::Create(other->get(), comm.get(), o);
  ASSERT_TRUE(ht2.ok());
  ASSERT_TRUE((*ht2)->RestoreLatest(dir.string()).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace orrery::rl::trainer_check
