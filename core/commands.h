// Subcommands implemented by core: `orrery config check`.
#pragma once

#include "core/cli.h"

namespace orrery {

void RegisterCoreCommands(CliRegistry& registry);

}  // namespace orrery
