// Collects the subcommands of every module into one registry.
#pragma once

#include "core/cli.h"

namespace orrery {

void RegisterAllCommands(CliRegistry& registry);

}  // namespace orrery
