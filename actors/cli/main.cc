// The `orrery` command line: builds a CLI11 parser from the commands every module registers.
// This is the only translation unit that includes CLI11 (it is slow to compile).
#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/cli/commands.h"
#include "core/cli.h"
#include "core/version.h"

namespace orrery {
namespace {

std::string LowerKey(const std::string& name) {
  std::string key = name;
  if (const auto comma = key.find(','); comma != std::string::npos) key = key.substr(comma + 1);
  while (!key.empty() && key[0] == '-') key.erase(0, 1);
  for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return key;
}

// "--max-tokens: expected an integer, got 'abc'" (CLI11 puts the option's name first).
CLI::Validator IntValidator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc::result_out_of_range) return "'" + text + "' is out of range";
        if (ec != std::errc() || ptr != end) return "expected an integer, got '" + text + "'";
        return "";
      },
      "INT");
}

CLI::Validator FloatValidator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(value)) {
          return "expected a number, got '" + text + "'";
        }
        return "";
      },
      "NUMBER");
}

struct OptionSlot {
  const CliOption* spec;
  std::vector<std::string> values;
  bool flag = false;
  CLI::Option* option = nullptr;
};

int Main(int argc, char** argv) {
  CliRegistry registry;
  RegisterAllCommands(registry);

  CLI::App app{
      "Orrery: trains hybrid long-context MoE language models, staged pretraining then "
      "asynchronous agentic RL",
      "orrery"};
  app.set_version_flag("--version",
                       std::string("orrery ") + kOrreryVersion + " (" + kOrreryGitRevision + ")");
  app.require_subcommand(1);
  app.failure_message(CLI::FailureMessage::simple);

  std::map<std::vector<std::string>, CLI::App*> nodes;
  nodes[{}] = &app;
  auto node_for = [&](const std::vector<std::string>& path) -> CLI::App* {
    std::vector<std::string> prefix;
    CLI::App* parent = &app;
    for (const std::string& part : path) {
      prefix.push_back(part);
      auto it = nodes.find(prefix);
      if (it == nodes.end()) {
        auto g = registry.groups().find(prefix);
        CLI::App* sub = parent->add_subcommand(part, g != registry.groups().end() ? g->second : "");
        it = nodes.emplace(prefix, sub).first;
      }
      parent = it->second;
    }
    return parent;
  };

  int exit_code = 0;
  std::vector<std::unique_ptr<std::vector<OptionSlot>>> all_slots;
  for (const CliCommand& cmd : registry.commands()) {
    std::vector<std::string> parent_path(cmd.path.begin(), cmd.path.end() - 1);
    CLI::App* parent = node_for(parent_path);
    CLI::App* sub = parent->add_subcommand(cmd.path.back(), cmd.help);
    nodes[cmd.path] = sub;
    auto slots = std::make_unique<std::vector<OptionSlot>>(cmd.options.size());
    for (size_t i = 0; i < cmd.options.size(); ++i) {
      const CliOption& o = cmd.options[i];
      OptionSlot& slot = (*slots)[i];
      slot.spec = &o;
      std::string help = o.help;
      if (o.kind == CliKind::kFlag) {
        slot.option = sub->add_flag(o.name, slot.flag, help);
        continue;
      }
      slot.option = sub->add_option(o.name, slot.values, help);
      if (o.kind != CliKind::kStringList) slot.option->expected(1);
      if (o.kind == CliKind::kInt) slot.option->check(IntValidator());
      if (o.kind == CliKind::kFloat) slot.option->check(FloatValidator());
      if (o.required) slot.option->required();
      if (!o.default_value.empty()) slot.option->default_str(o.default_value);
    }
    std::vector<OptionSlot>* slot_ptr = slots.get();
    all_slots.push_back(std::move(slots));
    const CliCommand* cmd_ptr = &cmd;
    sub->callback([cmd_ptr, slot_ptr, &exit_code] {
      CliArgs args;
      for (const OptionSlot& slot : *slot_ptr) {
        const std::string key = LowerKey(slot.spec->name);
        if (slot.spec->kind == CliKind::kFlag) {
          args.Set(key, {slot.flag ? "true" : "false"});
        } else if (!slot.values.empty()) {
          args.Set(key, slot.values);
        } else if (!slot.spec->default_value.empty()) {
          args.Set(key, {slot.spec->default_value});
        }
      }
      exit_code = cmd_ptr->run(args);
    });
  }
  // Every group needs one of its subcommands.
  for (auto& [path, node] : nodes) {
    if (!path.empty() && registry.groups().count(path)) node->require_subcommand(1);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A bad command line is bad input like any other: one line, exit code 2 (see ReportError).
    std::fprintf(stderr, "orrery: %s (run with --help for more information)\n", e.what());
    return 2;
  }
  return exit_code;
}

}  // namespace
}  // namespace orrery

int main(int argc, char** argv) { return orrery::Main(argc, argv); }
