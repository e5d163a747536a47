#include "core/commands.h"

#include <cstdio>

#include "core/run_config.h"

namespace orrery {

void RegisterCoreCommands(CliRegistry& registry) {
  registry.config_sections().Add("run", [](ConfigTable& root) { ReadRunConfig(root); });

  registry.AddGroup({"config"}, "Inspect Orrery configuration files");
  ConfigSections* sections = &registry.config_sections();
  registry.Add(
      CliCommand{{"config", "check"},
                 "Validate any Orrery config file strictly and print every resolved value",
                 {{"FILE", "the TOML file to check", CliKind::kString, /*required=*/true, ""}},
                 [sections](const CliArgs& args) {
                   const std::string path = args.Get("file");
                   StatusOr<ConfigDocument> doc = ConfigDocument::ParseFile(path);
                   if (!doc.ok()) return ReportError(doc.status());
                   Status s = sections->Validate(*doc);
                   if (!s.ok()) return ReportError(s);
                   std::printf("# %s: valid\n%s", path.c_str(), doc->ResolvedText().c_str());
                   return 0;
                 }});
}

}  // namespace orrery
