// The metrics subcommands: `orrery dashboard`, `orrery export` and `orrery metrics hub`.
#pragma once

#include "core/cli.h"

namespace orrery {

void RegisterMetricsCommands(CliRegistry& registry);

}  // namespace orrery
