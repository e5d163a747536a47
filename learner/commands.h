// `orrery tokenizer train`, `orrery data prepare`, `orrery pretrain` and `orrery generate`.
#pragma once

#include "core/cli.h"

namespace orrery {

// tokenizer train, data prepare, pretrain, generate, and the [pretrain]/[optimizer]/[[stages]]
// validators of `orrery config check`.
void RegisterLearnerCommands(CliRegistry& registry);

}  // namespace orrery
