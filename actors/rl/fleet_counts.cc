#include "actors/rl/fleet_counts.h"

namespace orrery::rl_actors {

int FleetRoleCount(ConfigTable& root, const std::string& role) {
  ConfigTable fleet = root.Table("fleet");
  for (ConfigTable& r : fleet.TableArray("roles")) {
    if (r.String("role", "") == role) return static_cast<int>(r.Int("count", 1, 1, 1 << 20));
  }
  return 1;
}

bool FleetHasRole(ConfigTable& root, const std::string& role) {
  ConfigTable fleet = root.Table("fleet");
  for (ConfigTable& r : fleet.TableArray("roles")) {
    if (r.String("role", "") == role) return true;
  }
  return false;
}

}  // namespace orrery::rl_actors
