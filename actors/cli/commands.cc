#include "actors/cli/commands.h"

#include "actors/envserver/commands.h"
#include "actors/launch/commands.h"
#include "actors/metrics/commands.h"
#include "actors/replay/commands.h"
#include "actors/rl/commands.h"
#include "core/commands.h"
#include "env/commands.h"
#include "learner/commands.h"
#include "model/commands.h"

namespace orrery {

// Each module adds one line here when it has a subcommand that works.
void RegisterAllCommands(CliRegistry& registry) {
  RegisterCoreCommands(registry);
  RegisterFleetCommands(registry);
  replay::RegisterReplayCommands(registry);
  RegisterMetricsCommands(registry);
  RegisterEnvCommands(registry);
  envserver::RegisterEnvServerCommands(registry);
  model::RegisterModelCommands(registry);
  RegisterLearnerCommands(registry);
  rl_actors::RegisterRlCommands(registry);
}

}  // namespace orrery
