#include "core/commands.h"

#include <cstdio>

#include "core/config_reference.h"
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
  registry.Add(CliCommand{
      {"config", "keys"},
      "List every config key the readers read: type, default, allowed values, description",
      {{"--section", "only this table and its sub-tables (env, rl.rollout, ...); default: all",
        CliKind::kString, false, ""},
       {"--format", "text, or md (the tables of docs/config-reference.md)", CliKind::kString, false,
        "text"}},
      [sections](const CliArgs& args) {
        StatusOr<std::vector<ConfigKeySpec>> keys = sections->ListKeys();
        if (!keys.ok()) return ReportError(keys.status());
        StatusOr<std::string> text =
            RenderConfigReference(*keys, kConfigKeyDescriptions, "docs/config-keys.toml",
                                  args.Get("section"), args.Get("format"));
        if (!text.ok()) return ReportError(text.status());
        std::fputs(text->c_str(), stdout);
        return 0;
      }});
}

}  // namespace orrery
