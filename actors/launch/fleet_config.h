// The [fleet] section: which actors run, how many, where, and how they are supervised.
//
//   [fleet]
//   transport = "ipc"            # ipc (one machine) or tcp (required for --emit slurm|k8s)
//   coordinator = ""             # default: ipc://<run.dir>/fleet/coordinator.sock, or
//                                #          tcp://<host>:<base_port> with transport = "tcp"
//   host = "127.0.0.1"           # tcp: the address actors bind (a local launch) or advertise
//   base_port = 5600             # tcp: the coordinator's port; actors take the following ones
//   curve_key_dir = ""           # tcp: the fleet's CURVE keys (fleet.key 0600, fleet.pub), every
//                                #   tcp socket authenticates with them (docs/actors.md); "":
//                                #   <run.dir>/curve, generated there by `orrery launch`
//   heartbeat_ms = 500
//   max_message_mb = 1024        # the largest ZeroMQ message any socket of the fleet accepts
//   heartbeat_timeout_ms = 3000  # silent this long -> killed and restarted
//   startup_timeout_ms = 30000   # spawn -> registration
//   progress_timeout_ms = 120000 # a role's progress counter (ActorContext::Progress) stalled
//                                #   this long -> the actor's watchdog ends it (exit 75) and it
//                                #   is restarted; 0: off
//   restart_backoff_ms = 250     # first restart delay; doubles per restart within the window
//   restart_backoff_max_ms = 10000
//   restart_budget = 5           # restarts of one instance within restart_window_s, then the
//   restart_window_s = 300       #   fleet fails and stops
//   shutdown_grace_ms = 5000     # SIGTERM -> SIGKILL
//   metrics_endpoint = ""        # the metrics hub's SUB endpoint ("" none); records also go to
//   metrics_interval_ms = 1000   #   <run.dir>/fleet_metrics.jsonl
//   dashboard = false            # true: `orrery launch` runs the metrics hub (bound at
//   dashboard_port = 0           #   metrics_endpoint) and serves the dashboard on
//                                #   127.0.0.1:dashboard_port (0: any free port), printing its URL
//
//   [[fleet.roles]]
//   role = "replay"              # a registered role (`orrery actor --help` lists them)
//   count = 1
//   port = 0                     # tcp: first port of this role (0: next free in the plan)
//   restart = "always"           # always | on-failure | never
//   cpus = 1                     # resources: used by --emit (srun / pod requests)
//   memory_gb = 1.0
//   gpus = 0
//   hosts = []                   # --emit slurm: nodes for this role (srun --nodelist)
//
//   [fleet.slurm]                # --emit slurm
//   partition = ""  account = ""  time = "24:00:00"  orrery = "orrery"
//   [fleet.k8s]                  # --emit k8s
//   namespace = "default"  image = "orrery:latest"  orrery = "orrery"
//   storage_class = ""           # the run volume's StorageClass ("": the cluster's default)
//   storage_size = "100Gi"       # the run volume's size (a Kubernetes quantity)
//
// Read strictly through core/config.h: unknown keys, wrong types, out-of-range values, unknown
// roles, duplicate roles and a fleet of zero actors are errors naming the file, line and key.
#pragma once

#include <string>
#include <vector>

#include "actors/coordinator/supervisor.h"
#include "core/config.h"
#include "core/run_config.h"

namespace orrery {

struct FleetRoleConfig {
  std::string role;
  int count = 1;
  int port = 0;
  RestartPolicy restart = RestartPolicy::kAlways;
  std::string restart_text = "always";
  int cpus = 1;
  double memory_gb = 1.0;
  int gpus = 0;
  std::vector<std::string> hosts;
};

struct FleetConfig {
  std::string transport = "ipc";
  std::string coordinator;  // resolved (never empty after reading)
  std::string host = "127.0.0.1";
  int base_port = 5600;
  std::string curve_key_dir;  // as configured ("": <run.dir>/curve); see FleetCurveKeyDir
  int heartbeat_ms = 500;
  int64_t max_message_mb = 1024;  // ZMQ_MAXMSGSIZE of every socket (core/message_limits.h)
  int heartbeat_timeout_ms = 3000;
  int startup_timeout_ms = 30000;
  int progress_timeout_ms = 120000;  // 0: off
  int restart_backoff_ms = 250;
  int restart_backoff_max_ms = 10000;
  int restart_budget = 5;
  int restart_window_s = 300;
  int shutdown_grace_ms = 5000;
  std::string metrics_endpoint;
  int metrics_interval_ms = 1000;
  bool dashboard = false;
  int dashboard_port = 0;
  std::vector<FleetRoleConfig> roles;

  std::string slurm_partition, slurm_account, slurm_time = "24:00:00", slurm_orrery = "orrery";
  std::string k8s_namespace = "default", k8s_image = "orrery:latest", k8s_orrery = "orrery";
  std::string k8s_storage_class, k8s_storage_size = "100Gi";
};

// Reads root.[fleet]; problems are recorded in the document (see ConfigDocument::Finish).
// `check_roles` looks every role up in the role registry (off only in tests of the reader).
FleetConfig ReadFleetConfig(ConfigTable& root, const RunConfig& run, bool check_roles = true);

// True when any socket of the fleet is tcp (the transport, the coordinator or the metrics hub):
// then every one of them authenticates with the fleet's CURVE keys.
bool FleetUsesTcp(const FleetConfig& fleet);
// Where the fleet's CURVE keys live: fleet.curve_key_dir, or <run.dir>/curve. Absolute.
std::string FleetCurveKeyDir(const FleetConfig& fleet, const RunConfig& run);

}  // namespace orrery
