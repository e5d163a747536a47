// Options of an environment server: the [env_server] config section.
//
//   [env_server]
//   listen = "tcp://127.0.0.1:5600"  # `orrery env serve` only (a fleet gives the endpoint)
//   envs = ["calc"]                  # environments served; default: [env].name alone
//   workers = 8                      # threads running reset/step/score (slow steps wait there)
//   max_episodes = 1024              # open episodes at once; more: ResourceExhausted
//   idle_timeout_s = 600             # an episode untouched this long is closed
//   max_call_s = 300                 # deadline of a call whose caller gave none (and a cap)
// Each served environment takes its options from [env.<name>] (env/registry.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "env/env.h"
#include "env/registry.h"

namespace orrery::envserver {

struct EnvServerOptions {
  std::string listen = "tcp://127.0.0.1:5600";
  std::vector<std::string> envs;  // empty: [env].name
  int workers = 8;
  int max_episodes = 1024;
  double idle_timeout_s = 600;
  double max_call_s = 300;
};

// Reads [env_server] from `root` (errors are recorded in the document: call Finish()).
EnvServerOptions ReadEnvServerOptions(ConfigTable& root);

// Creates the served environments: [env].name (plug-ins and MCP attachments included, see
// CreateEnvFromConfig) and every other name of `options.envs` with its [env.<name>] options.
// Keyed by name.
StatusOr<std::vector<std::unique_ptr<env::Env>>> CreateServedEnvs(ConfigTable& root,
                                                                  const EnvServerOptions& options,
                                                                  env::EnvRegistry& registry);

}  // namespace orrery::envserver
