// The [rl] section: what the RL phase trains, from which policy, with which fleet settings.
//
//   [rl]
//   init = "runs/demo/pretrain"   # the policy to start from: a checkpoint, checkpoints or run
//                                 #   directory (relative to the config file); default, when
//                                 #   the config pretrains: RUN/pretrain
//   steps = 120                   # learner updates (policy versions) of the phase
//   groups_per_step = 8           # groups per update, over all learner ranks
//   group_size = 8                # G: episodes per task
//   sync = false                  # true: rollouts wait for every update (`orrery launch --sync`);
//                                 #   each update trains on exactly one round of groups (no
//                                 #   dynamic sampling)
//   table = "trajectories"        # the replay table rollouts insert into and learners sample
//   checkpoint_every = 10         # learner checkpoints (RUN/rl/checkpoints), newest kept
//   keep_checkpoints = 2
//   keep_weights = 3              # published versions kept in RUN/rl/weights
//   eval_tasks = 50               # test-split tasks scored before and after the phase
//   eval_temperature = 0.0        # 0: greedy
//   gloo_timeout_ms = 60000       # learner-rank rendezvous and collectives
//
//   [rl.rollout]
//   slots = 16                    # episodes decoded together (continuous batching); also the
//                                 #   default size of the environment's sandbox pools
//   temperature = 1.0  top_p = 1.0
//   max_turns = 3  max_turn_tokens = 64  max_episode_tokens = 320
//   env_timeout_s = 30
//   max_step_tokens = 8192        # tokens one engine step feeds: every decoding episode, then
//                                 #   prompt and tool-result chunks (0: no bound; else >= slots)
//   env = "local"                 # where environment calls run, off the decode loop either way:
//                                 #   "local": on one env worker thread per slot in the rollout
//                                 #   process; "remote": on env servers (RemoteEnv)
//   env_endpoints = []            # remote: the servers (`orrery env serve`); empty: every
//                                 #   instance of the fleet's "env" role
//   weight_poll_ms = 200          # how often a rollout actor looks for a newer version
//   weights = "directory"         # where versions come from: "directory": RUN/rl/weights (one
//                                 #   machine, or a filesystem every host shares); "learner":
//                                 #   fetched from learner rank 0 over the fleet's transport into
//                                 #   the rollout's own state directory (no shared filesystem;
//                                 #   actors/rl/weight_fetcher.h); "shared": rollouts on learner
//                                 #   rank 0's host copy each version out of a buffer it shares
//                                 #   (CUDA IPC on the GPU, shared memory on the CPU:
//                                 #   model/shared_weights.h), no file between them; the
//                                 #   directory stays for other hosts and as the fallback
//   weight_chunk_mb = 1           # "learner": the size of one fetched chunk (larger ones were
//                                 #   slower: tests/bench/weights_bench.cc)
//
//   [rl.learner]
//   lr = 1e-4  beta1 = 0.9  beta2 = 0.95  eps = 1e-8  weight_decay = 0.0  max_grad_norm = 1.0
//   advantage = "grpo"            # grpo | dr_grpo | rloo
//   max_staleness = 4             # η (also the replay table's window)
//   routing_replay = true         # R3
//   skip_uniform_groups = true    # DAPO dynamic sampling
//   micro_batch_tokens = 2048       # tokens packed per forward/backward; a longer sample is a
//                                 #   micro-batch of its own (never cut)
//   recompute_layers = false      # run.device = "cuda": keep only each layer's inputs and re-run
//                                 #   the layer before its backward (model/gpu/gpu_model.h): one
//                                 #   more forward for a peak of one layer's activations, what
//                                 #   long sequences need
//   ppo_epochs = 1                # passes over each sampled batch (1..64)
//   minibatches = 1               # optimizer steps per pass (1..groups_per_step x group_size);
//                                 #   more than one step per update makes π_θ leave π_prox, so
//                                 #   the PPO clip acts
//   clip_low = 0.2  clip_high = 0.28  correction = "truncate"  level = "token"  is_cap = 5.0
//   entropy_coef = 0.0  kl_coef = 0.0
//   communicator = "gloo"         # learner ranks' collectives: gloo (CPU/TCP) | nccl (CUDA builds,
//                                 #   one GPU per rank: rank % visible devices; gloo_timeout_ms
//                                 #   bounds its rendezvous and collectives too)
//   gloo_public_network = false   # let Gloo ranks listen on a globally routable address (its
//                                 #   traffic is unauthenticated: by default they refuse to)
//
// The environment comes from [env] (env/registry.h), the replay store from [replay], the actors
// from [fleet] (roles "replay", "rollout", "learner"). Read strictly: unknown keys, wrong types and
// out-of-range values fail naming the file, line and key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "env/env.h"
#include "learner/rl/rl_trainer.h"
#include "rollout/agent_loop.h"

namespace orrery::rl_actors {

struct RlConfig {
  std::string init;
  int64_t steps = 120;
  int groups_per_step = 8;
  int group_size = 8;
  bool sync = false;
  std::string table = "trajectories";
  int64_t checkpoint_every = 10;
  int64_t keep_checkpoints = 2;
  int64_t keep_weights = 3;
  int eval_tasks = 50;
  double eval_temperature = 0.0;
  int64_t gloo_timeout_ms = 60000;
  std::string communicator = "gloo";  // [rl.learner] communicator, with more than one rank
  bool gloo_public_network = false;   // [rl.learner] gloo_public_network

  int slots = 16;
  rollout::AgentOptions agent;  // env_workers = slots
  bool remote_env = false;
  std::vector<std::string> env_endpoints;
  int64_t weight_poll_ms = 200;
  bool weights_from_learner = false;  // [rl.rollout] weights = "learner"
  bool weights_shared = false;        // [rl.rollout] weights = "shared"
  int64_t weight_chunk_mb = 1;

  rl::RlTrainerOptions trainer;
  bool recompute_layers = false;  // [rl.learner] recompute_layers: the GPU learner's model option
};

// Reads root.[rl]; problems are recorded in the document (see ConfigDocument::Finish).
RlConfig ReadRlConfig(ConfigTable& root);

// What a rollout actor asks of its environment: `slots` episodes in flight.
env::EnvDemand RolloutEnvDemand(const RlConfig& config);

// The `orrery config check` (and launch) validator of [rl]: ReadRlConfig, then what involves the
// rest of the file: without [pretrain], rl.init must name a checkpoint; the environment of [env]
// is created for the rollout's demand (so a sandbox pool smaller than the slots is refused).
void ValidateRlSection(ConfigTable& root);

}  // namespace orrery::rl_actors
