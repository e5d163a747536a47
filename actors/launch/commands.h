// `orrery launch`, `orrery actor ROLE` and `orrery fleet status`.
#pragma once

#include "core/cli.h"

namespace orrery {

// Also registers the built-in "echo" role and the [fleet] config validator.
void RegisterFleetCommands(CliRegistry& registry);

}  // namespace orrery
