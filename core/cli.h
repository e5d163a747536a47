// The `orrery` command registry.
//
// Each module describes its subcommands here (options, help, a run function) and the CLI entry
// point (actors/cli/main.cc, the only file that includes CLI11) turns them into a parser. Modules
// therefore never compile CLI11, which costs over 10 s per translation unit.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"

namespace orrery {

enum class CliKind { kFlag, kString, kInt, kFloat, kStringList };

struct CliOption {
  // "--config" (long), "-n,--num" (short and long) or "FILE" (positional, upper case).
  std::string name;
  std::string help;
  CliKind kind = CliKind::kString;
  bool required = false;
  std::string default_value;  // used when absent; shown in --help
};

class CliArgs {
 public:
  // Keys are the long name without dashes ("config"), or the positional name in lower case.
  bool Has(const std::string& key) const { return values_.count(key) != 0; }
  bool Flag(const std::string& key) const;
  std::string Get(const std::string& key, const std::string& def = "") const;
  // Integer/float options were validated by the parser; these only convert.
  int64_t Int(const std::string& key, int64_t def = 0) const;
  double Float(const std::string& key, double def = 0) const;
  std::vector<std::string> List(const std::string& key) const;
  void Set(const std::string& key, std::vector<std::string> values) {
    values_[key] = std::move(values);
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

struct CliCommand {
  std::vector<std::string> path;  // {"config", "check"} for `orrery config check`
  std::string help;
  std::vector<CliOption> options;
  // Returns the process exit code.
  std::function<int(const CliArgs&)> run;
};

class CliRegistry {
 public:
  void AddGroup(std::vector<std::string> path, std::string help);
  void Add(CliCommand command);
  const std::vector<CliCommand>& commands() const { return commands_; }
  const std::map<std::vector<std::string>, std::string>& groups() const { return groups_; }
  // The config validators `orrery config check` runs.
  ConfigSections& config_sections() { return config_sections_; }

 private:
  std::vector<CliCommand> commands_;
  std::map<std::vector<std::string>, std::string> groups_;
  ConfigSections config_sections_;
};

// Prints "orrery: <message>" on stderr and returns the exit code for the status (2 for invalid
// input, 1 otherwise).
int ReportError(const Status& status);

}  // namespace orrery
