// The environment registry: names to factories, for built-ins and plug-ins alike.
//
// Config shape (the [env] section, validated by `orrery config check`):
//   [env]
//   name = "calc"                 # which registered environment to create
//   plugins = ["/path/libmy.so"]  # C++ plug-ins loaded first (optional)
//   [env.calc]                    # options of the chosen environment, read by its factory
//   difficulty = 2
// A factory reads its options with ConfigTable getters (so unknown keys fail at Finish()).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"
#include "env/env.h"

namespace orrery::env {

using EnvFactory = std::function<StatusOr<std::unique_ptr<Env>>(ConfigTable& options)>;
// A factory that sizes what it keeps per episode (sandbox pools) from the caller's demand.
using SizedEnvFactory =
    std::function<StatusOr<std::unique_ptr<Env>>(ConfigTable& options, const EnvDemand& demand)>;

class EnvRegistry {
 public:
  // AlreadyExists when `name` is taken.
  Status Register(std::string name, std::string description, EnvFactory factory);
  Status RegisterSized(std::string name, std::string description, SizedEnvFactory factory);
  // NotFound (listing the registered names) for an unknown name.
  StatusOr<std::unique_ptr<Env>> Create(const std::string& name, ConfigTable& options,
                                        const EnvDemand& demand = {}) const;
  // (name, description), sorted by name.
  std::vector<std::pair<std::string, std::string>> List() const;

 private:
  struct Entry {
    std::string description;
    SizedEnvFactory factory;
  };
  std::map<std::string, Entry> entries_;
};

// Registers calc, python, retrieval and external (see docs/env.md).
void RegisterBuiltinEnvs(EnvRegistry& registry);

// Reads [env] from `root`: loads `plugins`, then creates the environment `name` with the options
// of [env.<name>], its sandbox pools sized for `demand`. Config errors are recorded in the
// document (call Finish()).
StatusOr<std::unique_ptr<Env>> CreateEnvFromConfig(ConfigTable& root, EnvRegistry& registry,
                                                   const EnvDemand& demand = {});

}  // namespace orrery::env
