#include "actors/rl/rl_config.h"

#include "actors/rl/fleet_counts.h"
#include "core/run_config.h"
#include "env/registry.h"
#include "learner/checkpoint.h"
#include "learner/comm/nccl_communicator.h"
#include "model/config.h"
#include "model/gpu/gpu_model.h"

namespace orrery::rl_actors {

RlConfig ReadRlConfig(ConfigTable& root) {
  RlConfig c;
  ConfigTable t = root.Table("rl");
  c.init = t.Path("init", "");
  c.steps = t.Int("steps", c.steps, 1);
  c.groups_per_step = static_cast<int>(t.Int("groups_per_step", c.groups_per_step, 1, 1 << 16));
  c.group_size = static_cast<int>(t.Int("group_size", c.group_size, 1, 1 << 12));
  c.sync = t.Bool("sync", c.sync);
  c.table = t.String("table", c.table);
  c.checkpoint_every = t.Int("checkpoint_every", c.checkpoint_every, 1);
  c.keep_checkpoints = t.Int("keep_checkpoints", c.keep_checkpoints, 1);
  c.keep_weights = t.Int("keep_weights", c.keep_weights, 1);
  c.eval_tasks = static_cast<int>(t.Int("eval_tasks", c.eval_tasks, 0, 1 << 20));
  c.eval_temperature = t.Float("eval_temperature", c.eval_temperature, 0.0, 100.0);
  c.gloo_timeout_ms = t.Int("gloo_timeout_ms", c.gloo_timeout_ms, 100);
  if (c.table.empty()) t.Fail("table", "expected a table name");

  ConfigTable r = t.Table("rollout");
  c.slots = static_cast<int>(r.Int("slots", c.slots, 1, 4096));
  c.agent.sampling.temperature = r.Float("temperature", 1.0, 0.0, 100.0);
  c.agent.sampling.top_p = r.Float("top_p", 1.0, 1e-6, 1.0);
  c.agent.max_turns = static_cast<int>(r.Int("max_turns", 3, 1, 1000));
  c.agent.max_turn_tokens = static_cast<int>(r.Int("max_turn_tokens", 64, 1, 1 << 20));
  c.agent.max_episode_tokens = static_cast<int>(r.Int("max_episode_tokens", 320, 2, 1 << 24));
  c.agent.env_timeout_seconds = r.Float("env_timeout_s", 30.0, 0.001, 86400.0);
  c.agent.max_step_tokens = r.Int("max_step_tokens", 8192, 0, int64_t{1} << 30);
  if (c.agent.max_step_tokens > 0 && c.agent.max_step_tokens < c.slots) {
    r.Fail("max_step_tokens",
           "expected 0 (no bound) or at least rl.rollout.slots = " + std::to_string(c.slots) +
               " (every decoding episode is fed each step)");
  }
  c.weight_poll_ms = r.Int("weight_poll_ms", c.weight_poll_ms, 1, 3600 * 1000);
  const std::string weights = r.Enum("weights", "directory", {"directory", "learner", "shared"});
  c.weights_from_learner = weights == "learner";
  c.weights_shared = weights == "shared";
  c.weight_chunk_mb = r.Int("weight_chunk_mb", c.weight_chunk_mb, 1, 512);
  // One env worker per slot: an episode has at most one env call in flight, so none waits for a
  // worker (the sandbox pools' sizing rule, EnvDemand).
  c.agent.env_workers = c.slots;
  c.remote_env = r.Enum("env", "local", {"local", "remote"}) == "remote";
  c.env_endpoints = r.StringList("env_endpoints", {});
  if (!c.env_endpoints.empty() && !c.remote_env) {
    r.Fail("env_endpoints", "is only read with env = \"remote\"");
  }
  if (c.remote_env && c.env_endpoints.empty() && !FleetHasRole(root, "env")) {
    r.Fail("env",
           "\"remote\" needs env servers: expected rl.rollout.env_endpoints or a "
           "[[fleet.roles]] entry with role = \"env\"");
  }

  ConfigTable l = t.Table("learner");
  rl::RlTrainerOptions& o = c.trainer;
  o.lr = l.Float("lr", 1e-4, 0.0, 10.0);
  o.adamw.beta1 = l.Float("beta1", o.adamw.beta1, 0.0, 0.999999);
  o.adamw.beta2 = l.Float("beta2", o.adamw.beta2, 0.0, 0.999999);
  o.adamw.eps = l.Float("eps", o.adamw.eps, 0.0, 1.0);
  o.adamw.weight_decay = l.Float("weight_decay", 0.0, 0.0, 10.0);
  o.max_grad_norm = l.Float("max_grad_norm", o.max_grad_norm);
  const std::string advantage = l.Enum("advantage", "grpo", {"grpo", "dr_grpo", "rloo"});
  if (StatusOr<rl::AdvantageKind> k = rl::ParseAdvantageKind(advantage); k.ok()) o.advantage = *k;
  o.max_staleness = l.Int("max_staleness", o.max_staleness, -1);
  o.routing_replay = l.Bool("routing_replay", o.routing_replay);
  o.skip_uniform_groups = l.Bool("skip_uniform_groups", o.skip_uniform_groups);
  o.micro_batch_tokens = l.Int("micro_batch_tokens", o.micro_batch_tokens, 16);
  c.recompute_layers = l.Bool("recompute_layers", c.recompute_layers);
  o.ppo_epochs = static_cast<int>(l.Int("ppo_epochs", o.ppo_epochs, 1, 64));
  o.minibatches = static_cast<int>(l.Int("minibatches", o.minibatches, 1, 4096));
  if (o.minibatches > c.groups_per_step * c.group_size) {
    l.Fail("minibatches", "expected at most groups_per_step x group_size = " +
                              std::to_string(c.groups_per_step * c.group_size) +
                              " (the samples of an update)");
  }
  o.loss.clip_low = l.Float("clip_low", o.loss.clip_low, 0.0, 1.0);
  o.loss.clip_high = l.Float("clip_high", o.loss.clip_high, 0.0, 10.0);
  const std::string correction = l.Enum("correction", "truncate", {"none", "truncate", "mask"});
  if (auto v = rl::ParseIsCorrection(correction); v.ok()) o.loss.correction = *v;
  const std::string level = l.Enum("level", "token", {"token", "sequence", "geometric"});
  if (auto v = rl::ParseIsLevel(level); v.ok()) o.loss.level = *v;
  o.loss.is_cap = l.Float("is_cap", o.loss.is_cap, 1.0 + 1e-9, 1e6);
  o.loss.entropy_coef = l.Float("entropy_coef", o.loss.entropy_coef, -10.0, 10.0);
  o.loss.kl_coef = l.Float("kl_coef", o.loss.kl_coef, 0.0, 10.0);
  c.communicator = l.Enum("communicator", c.communicator, {"gloo", "nccl"});
  c.gloo_public_network = l.Bool("gloo_public_network", c.gloo_public_network);
  if (c.communicator == "nccl" && !comm::NcclAvailable()) {
    l.Fail("communicator",
           "\"nccl\" needs a build with CUDA and NCCL (this one has no NCCL): expected \"gloo\"");
  }
  o.temperature = c.agent.sampling.temperature > 0 ? c.agent.sampling.temperature : 1.0;
  if (o.loss.kl_coef > 0)
    l.Fail("kl_coef", "needs a reference policy, which the RL phase does not keep yet: expected 0");
  return c;
}

env::EnvDemand RolloutEnvDemand(const RlConfig& config) {
  return env::EnvDemand{config.slots, "rl.rollout.slots"};
}

void ValidateRlSection(ConfigTable& root) {
  const RlConfig c = ReadRlConfig(root);
  const RunConfig run = ReadRunConfig(root);
  ConfigTable t = root.Table("rl");
  // With [pretrain], rl.init (default RUN/pretrain) may be what the pretraining phase writes.
  if (!root.Has("pretrain")) {
    if (c.init.empty()) {
      t.Fail("init",
             "not set and the config does not pretrain: expected the initial policy's checkpoint "
             "or run directory");
    } else if (StatusOr<std::string> dir = ResolveCheckpointDir(c.init); !dir.ok()) {
      t.Fail("init", dir.status().message());
    } else if (run.device == RunDevice::kCuda) {
      // The RL roles build the GPU model from the policy's model.toml: one that does not load
      // fails here, before a fleet starts.
      StatusOr<model::ModelConfig> mc = model::LoadModelConfig(*dir + "/model.toml");
      if (!mc.ok()) t.Fail("init", "run.device = \"cuda\": " + mc.status().message());
    }
  }
  env::EnvRegistry registry;
  env::RegisterBuiltinEnvs(registry);
  StatusOr<std::unique_ptr<env::Env>> made =
      env::CreateEnvFromConfig(root, registry, RolloutEnvDemand(c));
  if (!made.ok()) root.Table("env").Fail("name", made.status().message());
}

}  // namespace orrery::rl_actors
