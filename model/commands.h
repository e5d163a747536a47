// The model module's subcommands: `orrery model info` (parameter, state and FLOP arithmetic of a
// config) and `orrery ops run` (one op on tensors from a safetensors file, for cross-framework
// checks), plus the [model] config validator used by `orrery config check`.
#pragma once

#include "core/cli.h"

namespace orrery::model {

void RegisterModelCommands(CliRegistry& registry);

}  // namespace orrery::model
