// Cluster launch files rendered from a [fleet] config (`orrery launch CONFIG --emit slurm|k8s`),
// described in docs/launch.md.
//
// slurm: one batch script. The batch step runs the coordinator (`orrery launch --external`: the
//        phases before the fleet, then the registry; an RL run's summary at the end); once it
//        answers, each role is one `srun` step with `count` tasks and the role's
//        cpus/memory/gpus/hosts; task i is instance i, listening on tcp://*:<port + i>, and
//        restarts its actor as the local supervisor would (backoff, fleet.restart_budget within
//        restart_window_s). A spent budget fails the step, and the job then stops the fleet and
//        exits non-zero.
// k8s:   a ConfigMap holding the config file, a PersistentVolumeClaim for the run's files
//        (mounted at /orrery, the pods' working directory and --config-dir; run.dir and the
//        replay store's paths must resolve under it), the coordinator's Service, and for the
//        coordinator and each role an Indexed Job (completions = count, the completion index is
//        the instance index, backoffLimit = fleet.restart_budget, GPUs in requests and limits).
// Both need transport = "tcp" (actors on different machines). Actors get the fleet's
// --heartbeat-ms and --progress-timeout-ms (no supervisor watches them there: each one's own
// watchdog ends it when its loop hangs), bind tcp://*:PORT and advertise ORRERY_ADVERTISE_HOST (the
// pod IP) or the node's host name (actors/runtime/advertise.h).
#pragma once

#include <string>

#include "actors/launch/fleet_config.h"
#include "core/run_config.h"

namespace orrery {

StatusOr<std::string> EmitLaunchFiles(const std::string& kind, const FleetConfig& fleet,
                                      const RunConfig& run, const std::string& config_path);

}  // namespace orrery
