// C++ environment plug-ins: shared libraries that register environment factories.
//
// A plug-in is built against Orrery's headers and exports two C symbols (so dlsym finds them
// without C++ name mangling; the version guards against a plug-in built for another ABI):
//
//   extern "C" int orrery_env_plugin_abi_version(void);   // returns ORRERY_ENV_PLUGIN_ABI
//   extern "C" int orrery_env_plugin_register_v1(orrery::env::EnvRegistry* registry);
//                                                 // registers factories; 0 on success
//
// The host executable exports its symbols (ENABLE_EXPORTS), so the plug-in calls Orrery's own
// code (Status, ConfigTable, EnvRegistry::Register) rather than carrying a copy. Plug-ins are
// listed in the config: [env] plugins = ["path/to/libmy_env.so"] (relative to the config file).
// env/examples/plugin/countdown_plugin.cc is a complete example.
#pragma once

#include <string>

#include "core/status.h"
#include "env/registry.h"

#define ORRERY_ENV_PLUGIN_ABI 1

namespace orrery::env {

// dlopen()s `path`, checks the ABI version and calls the register function. The library stays
// loaded for the life of the process. Errors name the path and what was wrong.
Status LoadEnvPlugin(const std::string& path, EnvRegistry& registry);

}  // namespace orrery::env
