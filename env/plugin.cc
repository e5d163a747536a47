#include "env/plugin.h"

#include <dlfcn.h>

namespace orrery::env {

Status LoadEnvPlugin(const std::string& path, EnvRegistry& registry) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return InvalidArgumentError("env plug-in " + path + ": cannot load: " + (err ? err : "?"));
  }
  using AbiFn = int (*)();
  using RegisterFn = int (*)(EnvRegistry*);
  auto abi = reinterpret_cast<AbiFn>(dlsym(handle, "orrery_env_plugin_abi_version"));
  auto reg = reinterpret_cast<RegisterFn>(dlsym(handle, "orrery_env_plugin_register_v1"));
  if (abi == nullptr || reg == nullptr) {
    dlclose(handle);
    return InvalidArgumentError(
        "env plug-in " + path +
        ": missing orrery_env_plugin_abi_version or orrery_env_plugin_register_v1");
  }
  if (abi() != ORRERY_ENV_PLUGIN_ABI) {
    const int got = abi();
    dlclose(handle);
    return FailedPreconditionError("env plug-in " + path + " was built for ABI " +
                                   std::to_string(got) + ", this Orrery has ABI " +
                                   std::to_string(ORRERY_ENV_PLUGIN_ABI));
  }
  if (reg(&registry) != 0) {
    return FailedPreconditionError("env plug-in " + path + ": its register function failed");
  }
  return Status::OK();
}

}  // namespace orrery::env
