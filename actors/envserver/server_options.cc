#include "actors/envserver/server_options.h"

#include <set>

namespace orrery::envserver {

EnvServerOptions ReadEnvServerOptions(ConfigTable& root) {
  ConfigTable t = root.Table("env_server");
  EnvServerOptions o;
  o.listen = t.String("listen", o.listen);
  o.envs = t.StringList("envs", {});
  o.workers = static_cast<int>(t.Int("workers", o.workers, 1, 1024));
  o.max_episodes = static_cast<int>(t.Int("max_episodes", o.max_episodes, 1, 1 << 20));
  o.idle_timeout_s = t.Float("idle_timeout_s", o.idle_timeout_s, 0.01, 1e7);
  o.max_call_s = t.Float("max_call_s", o.max_call_s, 0.01, 1e6);
  std::set<std::string> seen;
  for (const std::string& name : o.envs) {
    if (!seen.insert(name).second) t.Fail("envs", "'" + name + "' is listed twice");
  }
  return o;
}

StatusOr<std::vector<std::unique_ptr<env::Env>>> CreateServedEnvs(ConfigTable& root,
                                                                  const EnvServerOptions& options,
                                                                  env::EnvRegistry& registry) {
  std::vector<std::unique_ptr<env::Env>> envs;
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<env::Env> primary,
                          env::CreateEnvFromConfig(root, registry));
  const std::string primary_name = primary->name();
  envs.push_back(std::move(primary));
  for (const std::string& name : options.envs) {
    if (name == primary_name) continue;
    ConfigTable table = root.Table("env").Table(name);
    StatusOr<std::unique_ptr<env::Env>> made = registry.Create(name, table);
    if (!made.ok()) return made.status().WithContext("env_server.envs");
    envs.push_back(std::move(made).value());
  }
  return envs;
}

}  // namespace orrery::envserver
