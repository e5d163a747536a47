// `orrery pretrain` and `orrery generate`: the commands that need the hybrid model itself.
#pragma once

#include "core/cli.h"

namespace orrery {

void RegisterPretrainCommands(CliRegistry& registry);

}  // namespace orrery
