#include "core/cli.h"

#include <cstdio>
#include <cstdlib>

namespace orrery {

bool CliArgs::Flag(const std::string& key) const {
  auto it = values_.find(key);
  return it != values_.end() && !it->second.empty() && it->second[0] == "true";
}

std::string CliArgs::Get(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  return it == values_.end() || it->second.empty() ? def : it->second[0];
}

int64_t CliArgs::Int(const std::string& key, int64_t def) const {
  auto it = values_.find(key);
  return it == values_.end() || it->second.empty()
             ? def
             : std::strtoll(it->second[0].c_str(), nullptr, 10);
}

double CliArgs::Float(const std::string& key, double def) const {
  auto it = values_.find(key);
  return it == values_.end() || it->second.empty() ? def
                                                   : std::strtod(it->second[0].c_str(), nullptr);
}

std::vector<std::string> CliArgs::List(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

void CliRegistry::AddGroup(std::vector<std::string> path, std::string help) {
  groups_[std::move(path)] = std::move(help);
}

void CliRegistry::Add(CliCommand command) { commands_.push_back(std::move(command)); }

int ReportError(const Status& status) {
  std::fprintf(stderr, "orrery: %s\n", status.message().c_str());
  return status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound ||
                 status.code() == StatusCode::kDataLoss
             ? 2
             : 1;
}

}  // namespace orrery
