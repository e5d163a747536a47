// The `orrery env ...` subcommands: synth (synthetic transcripts), and the environment tools.
#pragma once

#include "core/cli.h"

namespace orrery {

void RegisterEnvCommands(CliRegistry& registry);

}  // namespace orrery
