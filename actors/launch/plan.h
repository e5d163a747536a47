// The process plan of a fleet: one entry per actor instance (name, endpoint, command line), built
// from the [fleet] config. `orrery launch --dry-run` prints it; `orrery launch` hands it to the
// supervisor after PreflightFleet has checked that it can run here.
#pragma once

#include <string>
#include <vector>

#include "actors/coordinator/supervisor.h"
#include "actors/launch/fleet_config.h"
#include "core/run_config.h"

namespace orrery {

struct FleetPlan {
  std::string coordinator;    // endpoint
  std::string run_dir;        // absolute
  std::string curve_key_dir;  // the fleet's CURVE keys when it uses tcp (absolute), else ""
  std::vector<ProcessSpec> processes;
};

// `orrery_binary`: the path spawned for each actor (`orrery actor ROLE ...`); `config_path`: the
// config every actor reads (made absolute).
StatusOr<FleetPlan> BuildFleetPlan(const FleetConfig& fleet, const RunConfig& run,
                                   const std::string& config_path,
                                   const std::string& orrery_binary);

// A table: role, instance, endpoint, restart policy, command line.
std::string FormatFleetPlan(const FleetPlan& plan);

// Checks, before anything starts, that every endpoint can be bound on this machine: tcp hosts
// resolve and are local addresses, ports are free, ipc paths fit a socket address and nothing
// listens there yet. Creates the socket directories. One line per problem, naming the actor.
Status PreflightFleet(const FleetPlan& plan);

// Shell-quotes one argument ('...' when needed).
std::string ShellQuote(const std::string& arg);

}  // namespace orrery
