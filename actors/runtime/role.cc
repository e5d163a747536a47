#include "actors/runtime/role.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "core/logging.h"

namespace orrery {
namespace {

std::mutex& RolesMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, ActorRole>& Roles() {
  static auto* roles = new std::map<std::string, ActorRole>();
  return *roles;
}

bool ValidRoleName(const std::string& name) {
  if (name.empty() || !(name[0] >= 'a' && name[0] <= 'z')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

ActorContext::ActorContext(Fields fields, zmq::context_t& zmq, Cancellation& stop, FleetLink& fleet,
                           ConfigDocument* config)
    : fields_(std::move(fields)),
      name_(fields_.role + ":" + std::to_string(fields_.index)),
      zmq_(zmq),
      stop_(stop),
      fleet_(fleet),
      config_(config) {
  if (config_ == nullptr) {
    StatusOr<ConfigDocument> empty = ConfigDocument::ParseString("", "<no config>");
    if (empty.ok()) empty_config_.emplace(std::move(empty).value());
  }
}

ConfigTable ActorContext::config_root() {
  return config_ != nullptr ? config_->root() : empty_config_->root();
}

void RegisterActorRole(ActorRole role) {
  if (!ValidRoleName(role.name) || !role.main) {
    ORRERY_LOG(ERROR) << "RegisterActorRole: invalid role '" << role.name
                      << "' (name must match [a-z][a-z0-9_]*, main must be set); ignored";
    return;
  }
  std::lock_guard<std::mutex> lock(RolesMutex());
  if (Roles().count(role.name)) {
    ORRERY_LOG(ERROR) << "RegisterActorRole: role '" << role.name
                      << "' is registered twice; keeping the first";
    return;
  }
  std::string name = role.name;
  Roles().emplace(std::move(name), std::move(role));
}

const ActorRole* FindActorRole(const std::string& name) {
  std::lock_guard<std::mutex> lock(RolesMutex());
  auto it = Roles().find(name);
  return it == Roles().end() ? nullptr : &it->second;
}

std::vector<std::string> ActorRoleNames() {
  std::lock_guard<std::mutex> lock(RolesMutex());
  std::vector<std::string> names;
  for (const auto& [name, role] : Roles()) names.push_back(name);
  return names;
}

}  // namespace orrery
