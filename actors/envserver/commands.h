// The environment server's entry points: the "env" actor role (one environment worker of a
// fleet) and `orrery env serve --config F [--listen ENDPOINT]` (the same server standalone).
#pragma once

#include <functional>
#include <string>
#include <zmq.hpp>

#include "actors/envserver/server.h"
#include "actors/runtime/cancellation.h"
#include "core/cli.h"
#include "core/config.h"

namespace orrery::envserver {

// Creates the environments of `root` ([env], [env_server]), binds `endpoint`, calls `on_ready`
// once it serves, and serves until `stop` is cancelled, calling `on_iteration` (when set) once
// per turn of the serving loop. What both entry points run.
Status ServeEnvs(zmq::context_t& zmq, const std::string& name, ConfigTable root,
                 const std::string& endpoint, const Cancellation& stop,
                 const std::function<void(const EnvServer&)>& on_ready,
                 const std::function<void()>& on_iteration = nullptr);

// Registers the "env" role, the [env_server] config validator and `orrery env serve`.
void RegisterEnvServerCommands(CliRegistry& registry);

}  // namespace orrery::envserver
