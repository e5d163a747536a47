// Cluster launch files rendered from a [fleet] config (`orrery launch CONFIG --emit slurm|k8s`),
// described in docs/launch.md.
//
// slurm: one batch script. The batch step runs the coordinator (`orrery launch --external`);
//        each role is one `srun` step with `count` tasks and the role's cpus/memory/gpus/hosts;
//        task i is instance i, listening on tcp://*:<port + i>; a failed instance is restarted in
//        place by its step with backoff.
// k8s:   a ConfigMap holding the config file, the coordinator's Deployment and Service, and per
//        role a headless Service and a StatefulSet (replicas = count; the pod ordinal is the
//        index; Kubernetes restarts failed pods).
// Both need transport = "tcp" (actors on different machines).
#pragma once

#include <string>

#include "actors/launch/fleet_config.h"
#include "core/run_config.h"

namespace orrery {

StatusOr<std::string> EmitLaunchFiles(const std::string& kind, const FleetConfig& fleet,
                                      const RunConfig& run, const std::string& config_path);

}  // namespace orrery
