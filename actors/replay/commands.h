// `orrery replay serve|info|checkpoint|bench`, the [replay] config validator and the "replay"
// actor role.
#pragma once

#include "core/cli.h"

namespace orrery::replay {

void RegisterReplayCommands(CliRegistry& registry);

}  // namespace orrery::replay
