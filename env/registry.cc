#include "env/registry.h"

#include "env/calc/calc_env.h"
#include "env/external/external_env.h"
#include "env/mcp/mcp_tools_env.h"
#include "env/plugin.h"
#include "env/python/python_env.h"
#include "env/retrieval/retrieval_env.h"

namespace orrery::env {

Status EnvRegistry::Register(std::string name, std::string description, EnvFactory factory) {
  return RegisterSized(std::move(name), std::move(description),
                       [factory = std::move(factory)](ConfigTable& options, const EnvDemand&) {
                         return factory(options);
                       });
}

Status EnvRegistry::RegisterSized(std::string name, std::string description,
                                  SizedEnvFactory factory) {
  if (entries_.count(name))
    return AlreadyExistsError("environment '" + name + "' is registered twice");
  entries_[std::move(name)] = Entry{std::move(description), std::move(factory)};
  return Status::OK();
}

StatusOr<std::unique_ptr<Env>> EnvRegistry::Create(const std::string& name, ConfigTable& options,
                                                   const EnvDemand& demand) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string names;
    for (const auto& [n, e] : entries_) names += (names.empty() ? "" : ", ") + n;
    return NotFoundError("unknown environment '" + name + "' (registered: " + names + ")");
  }
  return it->second.factory(options, demand);
}

std::vector<std::pair<std::string, std::string>> EnvRegistry::List() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [n, e] : entries_) out.emplace_back(n, e.description);
  return out;
}

}  // namespace orrery::env

namespace orrery::env {

void RegisterBuiltinEnvs(EnvRegistry& registry) {
  (void)registry.Register("calc", "arithmetic questions, the calculate tool, exact-answer reward",
                          [](ConfigTable& options) -> StatusOr<std::unique_ptr<Env>> {
                            return calc::MakeCalcEnv(calc::ReadCalcEnvOptions(options));
                          });
  (void)registry.RegisterSized(
      "python",
      "coding tasks with hidden tests; run_python runs in the bubblewrap sandbox; reward = "
      "fraction of tests passed",
      [](ConfigTable& options, const EnvDemand& demand) -> StatusOr<std::unique_ptr<Env>> {
        return MakePythonEnv(ReadPythonEnvOptions(options, demand));
      });
  (void)registry.Register("retrieval",
                          "long-document question answering (1K-1M words), the document behind "
                          "search and read or in the prompt; exact-match reward",
                          [](ConfigTable& options) -> StatusOr<std::unique_ptr<Env>> {
                            return MakeRetrievalEnv(ReadRetrievalEnvOptions(options));
                          });
  (void)registry.RegisterSized(
      "external",
      "any-language environment: a program speaking orrery-env/1 (JSON lines on stdio), run in "
      "the sandbox",
      [](ConfigTable& options, const EnvDemand& demand) -> StatusOr<std::unique_ptr<Env>> {
        return MakeExternalEnv(ReadExternalEnvOptions(options, demand));
      });
}

StatusOr<std::unique_ptr<Env>> CreateEnvFromConfig(ConfigTable& root, EnvRegistry& registry,
                                                   const EnvDemand& demand) {
  ConfigTable env = root.Table("env");
  const std::vector<std::string> plugins = env.StringList("plugins", {});
  for (const std::string& p : plugins) {
    ORRERY_RETURN_IF_ERROR(LoadEnvPlugin(p, registry));
  }
  const std::string name = env.String("name", "calc");
  ConfigTable options = env.Table(name);
  std::vector<McpAttachment> mcp = ReadMcpAttachments(env, demand);
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<Env> made, registry.Create(name, options, demand));
  return WithMcpTools(std::move(made), std::move(mcp));
}

}  // namespace orrery::env
