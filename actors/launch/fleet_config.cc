#include "actors/launch/fleet_config.h"

#include <filesystem>
#include <regex>
#include <set>

#include "actors/runtime/role.h"

namespace orrery {

FleetConfig ReadFleetConfig(ConfigTable& root, const RunConfig& run, bool check_roles) {
  FleetConfig c;
  ConfigTable t = root.Table("fleet");
  c.transport = t.Enum("transport", c.transport, {"ipc", "tcp"});
  c.host = t.String("host", c.host);
  c.base_port = static_cast<int>(t.Int("base_port", c.base_port, 1, 65535));
  c.curve_key_dir = t.Path("curve_key_dir", "");
  const std::string default_coordinator =
      c.transport == "tcp" ? "tcp://" + c.host + ":" + std::to_string(c.base_port)
                           : "ipc://" + run.dir + "/fleet/coordinator.sock";
  c.coordinator = t.String("coordinator", "");
  if (c.coordinator.empty()) c.coordinator = default_coordinator;
  if (c.coordinator.rfind("ipc://", 0) != 0 && c.coordinator.rfind("tcp://", 0) != 0) {
    t.Fail("coordinator", "expected an ipc:// or tcp:// endpoint, got '" + c.coordinator + "'");
  }
  c.heartbeat_ms = static_cast<int>(t.Int("heartbeat_ms", c.heartbeat_ms, 10, 60000));
  c.max_message_mb = t.Int("max_message_mb", c.max_message_mb, 1, 1 << 20);
  c.heartbeat_timeout_ms =
      static_cast<int>(t.Int("heartbeat_timeout_ms", c.heartbeat_timeout_ms, 50, 3600000));
  if (c.heartbeat_timeout_ms < 2 * c.heartbeat_ms) {
    t.Fail("heartbeat_timeout_ms", "must be at least twice fleet.heartbeat_ms (" +
                                       std::to_string(2 * c.heartbeat_ms) + "), got " +
                                       std::to_string(c.heartbeat_timeout_ms));
  }
  c.startup_timeout_ms =
      static_cast<int>(t.Int("startup_timeout_ms", c.startup_timeout_ms, 100, 3600000));
  c.progress_timeout_ms =
      static_cast<int>(t.Int("progress_timeout_ms", c.progress_timeout_ms, 0, 86400000));
  if (c.progress_timeout_ms != 0 && c.progress_timeout_ms < 2 * c.heartbeat_ms) {
    t.Fail("progress_timeout_ms", "must be 0 (off) or at least twice fleet.heartbeat_ms (" +
                                      std::to_string(2 * c.heartbeat_ms) + "), got " +
                                      std::to_string(c.progress_timeout_ms));
  }
  c.restart_backoff_ms =
      static_cast<int>(t.Int("restart_backoff_ms", c.restart_backoff_ms, 0, 3600000));
  c.restart_backoff_max_ms = static_cast<int>(
      t.Int("restart_backoff_max_ms", c.restart_backoff_max_ms, c.restart_backoff_ms, 3600000));
  c.restart_budget = static_cast<int>(t.Int("restart_budget", c.restart_budget, 0, 1000000));
  c.restart_window_s =
      static_cast<int>(t.Int("restart_window_s", c.restart_window_s, 1, 30 * 86400));
  c.shutdown_grace_ms =
      static_cast<int>(t.Int("shutdown_grace_ms", c.shutdown_grace_ms, 0, 3600000));
  c.metrics_endpoint = t.String("metrics_endpoint", "");
  c.metrics_interval_ms =
      static_cast<int>(t.Int("metrics_interval_ms", c.metrics_interval_ms, 100, 3600000));
  c.dashboard = t.Bool("dashboard", c.dashboard);
  c.dashboard_port = static_cast<int>(t.Int("dashboard_port", c.dashboard_port, 0, 65535));
  if (c.dashboard && c.metrics_endpoint.empty()) {
    t.Fail("dashboard",
           "the launcher's metrics hub needs fleet.metrics_endpoint (where actors "
           "publish, e.g. \"ipc://runs/x/fleet/metrics.sock\")");
  }

  std::set<std::string> seen;
  std::vector<ConfigTable> roles = t.TableArray("roles");
  int total = 0;
  for (ConfigTable& r : roles) {
    FleetRoleConfig rc;
    rc.role = r.RequiredString("role");
    rc.count = static_cast<int>(r.Int("count", 1, 0, 4096));
    rc.port = static_cast<int>(r.Int("port", 0, 0, 65535));
    rc.restart_text = r.Enum("restart", "always", {"always", "on-failure", "never"});
    rc.restart = ParseRestartPolicy(rc.restart_text).value();
    rc.cpus = static_cast<int>(r.Int("cpus", 1, 1, 4096));
    rc.memory_gb = r.Float("memory_gb", 1.0, 0.0, 1 << 20);
    rc.gpus = static_cast<int>(r.Int("gpus", 0, 0, 64));
    rc.hosts = r.StringList("hosts", {});
    if (!rc.role.empty()) {
      if (check_roles && FindActorRole(rc.role) == nullptr) {
        std::string known;
        for (const std::string& n : ActorRoleNames()) known += (known.empty() ? "" : ", ") + n;
        r.Fail("role", "unknown role '" + rc.role + "' (known: " + known + ")");
      }
      if (!seen.insert(rc.role).second) {
        r.Fail("role", "role '" + rc.role + "' appears twice; use count for more instances");
      }
    }
    total += rc.count;
    c.roles.push_back(std::move(rc));
  }
  if (t.present() && total == 0) {
    t.Fail("roles", "the fleet has no actors: add a [[fleet.roles]] entry with count >= 1");
  }

  ConfigTable slurm = t.Table("slurm");
  c.slurm_partition = slurm.String("partition", "");
  c.slurm_account = slurm.String("account", "");
  c.slurm_time = slurm.String("time", c.slurm_time);
  c.slurm_orrery = slurm.String("orrery", c.slurm_orrery);
  ConfigTable k8s = t.Table("k8s");
  c.k8s_namespace = k8s.String("namespace", c.k8s_namespace);
  c.k8s_image = k8s.String("image", c.k8s_image);
  c.k8s_orrery = k8s.String("orrery", c.k8s_orrery);
  c.k8s_storage_class = k8s.String("storage_class", "");
  c.k8s_storage_size = k8s.String("storage_size", c.k8s_storage_size);
  // What Kubernetes accepts as a storage request: a decimal with an optional binary or decimal
  // suffix ("100Gi", "1.5T", "500000000").
  static const std::regex kQuantity(
      R"(([0-9]+(\.[0-9]+)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?)");
  if (!std::regex_match(c.k8s_storage_size, kQuantity)) {
    k8s.Fail("storage_size", "expected a Kubernetes quantity such as \"100Gi\" or \"1Ti\", got '" +
                                 c.k8s_storage_size + "'");
  }
  return c;
}

bool FleetUsesTcp(const FleetConfig& fleet) {
  auto tcp = [](const std::string& endpoint) { return endpoint.rfind("tcp://", 0) == 0; };
  return fleet.transport == "tcp" || tcp(fleet.coordinator) || tcp(fleet.metrics_endpoint);
}

std::string FleetCurveKeyDir(const FleetConfig& fleet, const RunConfig& run) {
  std::error_code ec;
  const std::filesystem::path dir = fleet.curve_key_dir.empty()
                                        ? std::filesystem::path(run.dir) / "curve"
                                        : std::filesystem::path(fleet.curve_key_dir);
  return std::filesystem::absolute(dir, ec).lexically_normal().string();
}

}  // namespace orrery
