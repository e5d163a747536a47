#include "actors/launch/emit.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "actors/launch/plan.h"
#include "actors/replay/replay_config.h"
#include "actors/runtime/progress_watchdog.h"

namespace orrery {
namespace {

// Where pods mount the Secret with the fleet's CURVE keys.
constexpr char kK8sCurveDir[] = "/etc/orrery-curve";
// Where pods mount the run's volume; also their working directory and --config-dir.
constexpr char kK8sRunMount[] = "/orrery";

// A DNS-1123 name from a role or run name ("replay_store" -> "replay-store").
std::string KubeName(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) c = '-';
  }
  return s;
}

// First port of each role: explicit, or the next ones after the coordinator's base port.
std::vector<int> RolePorts(const FleetConfig& fleet) {
  std::vector<int> ports;
  int next = fleet.base_port + 1;
  for (const FleetRoleConfig& r : fleet.roles) {
    if (r.port > 0) {
      ports.push_back(r.port);
    } else {
      ports.push_back(next);
      next += r.count;
    }
  }
  return ports;
}

// Memory per CPU of one instance, in MiB (srun --mem-per-cpu).
int MemPerCpuMb(const FleetRoleConfig& r) {
  return std::max(1, static_cast<int>(r.memory_gb * 1024 / r.cpus + 0.999));
}

// One instance of a role, as a shell function the srun tasks run (exported into their
// environment). It restarts the actor the way the local supervisor does
// (actors/coordinator/supervisor.h): a clean exit ends an "on-failure" or "never" instance, and an
// "always" one once the fleet is stopping (or its coordinator is gone); "never" fails on any other
// exit; otherwise the actor is restarted after a backoff that doubles per restart within the
// window, and a failure after `restart_budget` restarts within `restart_window_s` fails the task.
// A failed task fails its step (--kill-on-bad-exit), and the batch script then stops the fleet.
void EmitInstanceFunction(const FleetConfig& fleet, std::ostream& o) {
  o << "# One instance of a role (task SLURM_PROCID of the role's step), restarted the way\n"
    << "# `orrery launch` restarts it: restart_budget = " << fleet.restart_budget
    << " restarts within restart_window_s = " << fleet.restart_window_s << ",\n"
    << "# backoff from " << fleet.restart_backoff_ms << " ms doubling to "
    << fleet.restart_backoff_max_ms << " ms. A spent budget fails the task, its step and the job.\n"
    << "orrery_fleet_running() {  # the coordinator answers and the run is not stopping\n"
    << "  local state\n"
    << "  state=\"$(\"$ORRERY\" fleet status --connect \"$COORDINATOR\" --curve-key-dir \"$KEYS\" "
       "--timeout-ms 2000 2>/dev/null | head -1)\"\n"
    << "  [ -n \"$state\" ] && [[ \"$state\" != *\"(stopping)\"* ]]\n"
    << "}\n"
    << "orrery_instance() {  # orrery_instance ROLE PORT RESTART\n"
    << "  local role=\"$1\" port=\"$2\" restart=\"$3\" index=\"$SLURM_PROCID\" rc how now delay t\n"
    << "  local name=\"$role:$index\"\n"
    << "  local -a restarts=() kept\n"
    << "  while true; do\n"
    << "    \"$ORRERY\" actor \"$role\" --index \"$index\" --endpoint \"tcp://*:$((port + "
       "index))\" \\\n"
    << "      --coordinator \"$COORDINATOR\" --config \"$CONFIG\" --heartbeat-ms "
    << fleet.heartbeat_ms << " --progress-timeout-ms " << fleet.progress_timeout_ms << " \\\n"
    << "      --max-message-mb " << fleet.max_message_mb << " --curve-key-dir \"$KEYS\"\n"
    << "    rc=$?\n"
    << "    if [ \"$rc\" -gt 128 ]; then how=\"killed by signal $((rc - 128))\"; else how=\"exit "
       "$rc\"; fi\n"
    << "    [ \"$rc\" -eq " << kNoProgressExitCode
    << " ] && how=\"$how: no progress for fleet.progress_timeout_ms\"\n"
    << "    if [ \"$rc\" -eq 0 ]; then\n"
    << "      if [ \"$restart\" != always ] || ! orrery_fleet_running; then\n"
    << "        echo \"orrery-slurm: $name finished ($how)\" >&2\n"
    << "        return 0\n"
    << "      fi\n"
    << "    elif [ \"$restart\" = never ]; then\n"
    << "      echo \"orrery-slurm: $name ended ($how) and is not restarted\" >&2\n"
    << "      return 1\n"
    << "    fi\n"
    << "    now=\"$(date +%s)\"\n"
    << "    kept=()\n"
    << "    for t in \"${restarts[@]}\"; do\n"
    << "      [ $((now - t)) -le " << fleet.restart_window_s << " ] && kept+=(\"$t\")\n"
    << "    done\n"
    << "    restarts=(\"${kept[@]}\")\n"
    << "    if [ \"${#restarts[@]}\" -ge " << fleet.restart_budget << " ]; then\n"
    << "      echo \"orrery-slurm: $name was restarted ${#restarts[@]} times within "
    << fleet.restart_window_s << " s (fleet.restart_budget) and ended again ($how)\" >&2\n"
    << "      return 1\n"
    << "    fi\n"
    << "    restarts+=(\"$now\")\n"
    << "    delay=$(( " << fleet.restart_backoff_ms
    << " << (${#restarts[@]} - 1 < 20 ? ${#restarts[@]} - 1 : 20) ))\n"
    << "    [ \"$delay\" -gt " << fleet.restart_backoff_max_ms
    << " ] && delay=" << fleet.restart_backoff_max_ms << "\n"
    << "    echo \"orrery-slurm: $name ended ($how); restarting in $delay ms (restart "
       "${#restarts[@]} of "
    << fleet.restart_budget << " allowed in " << fleet.restart_window_s << " s)\" >&2\n"
    << "    sleep \"$((delay / 1000)).$(printf %03d $((delay % 1000)))\"\n"
    << "  done\n"
    << "}\n"
    << "export -f orrery_fleet_running orrery_instance\n\n";
}

std::string EmitSlurm(const FleetConfig& fleet, const RunConfig& run, const std::string& config) {
  // One homogeneous allocation that holds every role's steps at once: a task slot per instance,
  // each as large as the largest instance (components of a heterogeneous job would not share
  // nodes). The steps take exactly what their role asks for (--exact).
  int total = 0, cpus = 1, mem_per_cpu = 1, gpus = 0;
  std::string nodes;  // every role's hosts: the allocation must hold them
  for (const FleetRoleConfig& r : fleet.roles) {
    if (r.count == 0) continue;
    for (const std::string& h : r.hosts) {
      if (("," + nodes + ",").find("," + h + ",") == std::string::npos) {
        nodes += (nodes.empty() ? "" : ",") + h;
      }
    }
    total += r.count;
    cpus = std::max(cpus, r.cpus);
    mem_per_cpu = std::max(mem_per_cpu, MemPerCpuMb(r));
    gpus = std::max(gpus, r.gpus);
  }
  std::ostringstream o;
  o << "#!/bin/bash\n"
    << "# SLURM batch script for the fleet of " << config << "\n"
    << "# Generated by `orrery launch " << config << " --emit slurm`; see docs/launch.md.\n"
    << "#SBATCH --job-name=" << run.name << "\n"
    << "#SBATCH --ntasks=" << total << "\n"
    << "#SBATCH --cpus-per-task=" << cpus << "\n"
    << "#SBATCH --mem-per-cpu=" << mem_per_cpu << "M\n";
  if (gpus > 0) o << "#SBATCH --gpus-per-task=" << gpus << "\n";
  if (!nodes.empty()) o << "#SBATCH --nodelist=" << nodes << "\n";
  if (!fleet.slurm_partition.empty()) o << "#SBATCH --partition=" << fleet.slurm_partition << "\n";
  if (!fleet.slurm_account.empty()) o << "#SBATCH --account=" << fleet.slurm_account << "\n";
  o << "#SBATCH --time=" << fleet.slurm_time << "\n"
    << "set -uo pipefail\n\n"
    << "export ORRERY=" << ShellQuote(fleet.slurm_orrery) << "\n"
    << "export CONFIG=" << ShellQuote(config) << "\n"
    << "export COORDINATOR=\"tcp://$(hostname):" << fleet.base_port << "\"\n"
    << "# The fleet's CURVE keys (every tcp socket authenticates with them): a directory every\n"
    << "# node mounts; made here on the first run, kept afterwards.\n"
    << "export KEYS=" << ShellQuote(FleetCurveKeyDir(fleet, run)) << "\n"
    << "\"$ORRERY\" fleet keygen \"$KEYS\" || exit 1\n\n";
  EmitInstanceFunction(fleet, o);
  o << "# The coordinator runs in the batch step: the phases before the fleet (pretraining, the\n"
    << "# initial policy's score), then registry, heartbeats, run state and status; after an RL\n"
    << "# phase's last version the final score and the run summary, and it exits.\n"
    << "\"$ORRERY\" launch \"$CONFIG\" --external --coordinator \"tcp://*:" << fleet.base_port
    << "\" --curve-key-dir \"$KEYS\" &\n"
    << "COORDINATOR_PID=$!\n"
    << "# scancel and the time limit signal every process of the job: stop in order.\n"
    << "signalled=\"\"\n"
    << "trap 'signalled=1' INT TERM\n"
    << "until \"$ORRERY\" fleet status --connect \"$COORDINATOR\" --curve-key-dir \"$KEYS\" "
       "--timeout-ms 1000 >/dev/null 2>&1; do\n"
    << "  if ! kill -0 \"$COORDINATOR_PID\" 2>/dev/null; then\n"
    << "    wait \"$COORDINATOR_PID\"; rc=$?\n"
    << "    echo \"orrery-slurm: the coordinator ended (exit $rc) before the fleet started\" >&2\n"
    << "    exit $((rc == 0 ? 1 : rc))\n"
    << "  fi\n"
    << "  if [ -n \"$signalled\" ]; then\n"
    << "    kill -TERM \"$COORDINATOR_PID\" 2>/dev/null; wait \"$COORDINATOR_PID\"; exit 143\n"
    << "  fi\n"
    << "  sleep 1\n"
    << "done\n\n"
    << "declare -A ROLE_OF  # step pid -> role\n";
  const std::vector<int> ports = RolePorts(fleet);
  for (size_t i = 0; i < fleet.roles.size(); ++i) {
    const FleetRoleConfig& r = fleet.roles[i];
    if (r.count == 0) continue;
    o << "# role " << r.role << ": " << r.count << " instance(s), restart " << r.restart_text
      << "\n"
      << "srun --exact --ntasks=" << r.count << " --cpus-per-task=" << r.cpus
      << " --mem-per-cpu=" << MemPerCpuMb(r) << "M";
    if (r.gpus > 0) {
      o << " --gpus-per-task=" << r.gpus;
    } else if (gpus > 0) {
      o << " --gres=none";  // else a step gets every GPU of the job
    }
    if (!r.hosts.empty()) {
      std::string list;
      for (const std::string& h : r.hosts) list += (list.empty() ? "" : ",") + h;
      o << " --nodelist=" << list;
    }
    o << " --kill-on-bad-exit=1 --job-name=" << r.role << " \\\n"
      << "  bash -c 'orrery_instance \"$@\"' orrery_instance " << r.role << " " << ports[i] << " "
      << r.restart_text << " &\n"
      << "ROLE_OF[$!]=" << r.role << "\n";
  }
  o << "\n# The job ends with the coordinator (an RL run: after its summary), with the first role\n"
    << "# whose step failed (an instance's restart budget spent, a failed \"never\" instance), or\n"
    << "# once every instance has finished; its exit status is the coordinator's or that step's.\n"
    << "status=0\n"
    << "while [ -z \"$signalled\" ]; do\n"
    << "  if ! kill -0 \"$COORDINATOR_PID\" 2>/dev/null; then\n"
    << "    wait \"$COORDINATOR_PID\"; status=$?; COORDINATOR_PID=\"\"\n"
    << "    [ \"$status\" -eq 0 ] || echo \"orrery-slurm: the coordinator failed (exit $status)\" "
       ">&2\n"
    << "    break\n"
    << "  fi\n"
    << "  for pid in \"${!ROLE_OF[@]}\"; do\n"
    << "    kill -0 \"$pid\" 2>/dev/null && continue\n"
    << "    wait \"$pid\"; rc=$?\n"
    << "    if [ \"$rc\" -ne 0 ] && [ \"$status\" -eq 0 ]; then\n"
    << "      echo \"orrery-slurm: role ${ROLE_OF[$pid]} failed (exit $rc): stopping the fleet\" "
       ">&2\n"
    << "      status=$rc\n"
    << "    fi\n"
    << "    unset \"ROLE_OF[$pid]\"\n"
    << "  done\n"
    << "  [ \"$status\" -eq 0 ] && [ \"${#ROLE_OF[@]}\" -gt 0 ] || break\n"
    << "  sleep 1\n"
    << "done\n"
    << "[ -z \"$signalled\" ] || status=143\n"
    << "# Stopping the coordinator marks the run \"stopping\": every actor stops at its next\n"
    << "# heartbeat. The steps get fleet.shutdown_grace_ms, then srun passes them a SIGTERM.\n"
    << "if [ -n \"$COORDINATOR_PID\" ]; then kill -TERM \"$COORDINATOR_PID\" 2>/dev/null; wait "
       "\"$COORDINATOR_PID\"; fi\n"
    << "end=$((SECONDS + " << (fleet.shutdown_grace_ms + 999) / 1000 << "))\n"
    << "while [ -n \"$(jobs -pr)\" ] && [ \"$SECONDS\" -lt \"$end\" ]; do sleep 1; done\n"
    << "[ -z \"$(jobs -pr)\" ] || kill -TERM $(jobs -pr) 2>/dev/null\n"
    << "wait\n"
    << "exit \"$status\"\n";
  return o.str();
}

// Where a path of the config lives in a pod: explicit relative paths resolve against
// --config-dir, defaults against the working directory, both the run volume.
std::string PodPath(const std::string& path) {
  std::filesystem::path p(path);
  if (!p.is_absolute()) p = std::filesystem::path(kK8sRunMount) / p;
  return p.lexically_normal().string();
}

// The files the fleet writes (run directory: weights, checkpoints, the Gloo store, actors'
// state; the replay store's database and checkpoints) must be on the run volume, where every pod
// sees them and they outlive pods.
Status CheckPathsOnRunVolume(const FleetConfig& fleet, const std::string& config) {
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseFile(config, kK8sRunMount));
  ConfigTable root = doc.root();
  std::vector<std::pair<std::string, std::string>> written = {{"run.dir", ReadRunConfig(root).dir}};
  const bool has_replay = std::any_of(fleet.roles.begin(), fleet.roles.end(),
                                      [](const FleetRoleConfig& r) { return r.role == "replay"; });
  if (has_replay) {
    const replay::ReplayConfig r = replay::ReadReplayConfig(root);
    written.push_back({"replay.path", r.storage.path});
    written.push_back({"replay.checkpoint_dir", r.checkpoint_root});
  }
  const std::string mount = std::string(kK8sRunMount) + "/";
  for (const auto& [key, path] : written) {
    const std::string in_pod = PodPath(path);
    if ((in_pod + "/").rfind(mount, 0) != 0) {
      return InvalidArgumentError(config + ": " + key + ": resolves to " + in_pod +
                                  " in the pods, off the run volume mounted at " + kK8sRunMount +
                                  " (--emit k8s keeps the run's files there): use a relative path");
    }
  }
  return Status::OK();
}

StatusOr<std::string> EmitK8s(const FleetConfig& fleet, const RunConfig& run,
                              const std::string& config) {
  std::ifstream in(config);
  if (!in) return IoError(config + ": cannot read the config to embed it in a ConfigMap");
  std::stringstream text;
  text << in.rdbuf();
  ORRERY_RETURN_IF_ERROR(CheckPathsOnRunVolume(fleet, config));
  const std::string base = KubeName(run.name);
  const std::string ns = fleet.k8s_namespace;
  const std::string secret = base + "-curve";
  const std::string volume = base + "-run";
  const std::string coord_service = base + "-coordinator";
  const std::string coord =
      "tcp://" + coord_service + "." + ns + ".svc:" + std::to_string(fleet.base_port);
  const std::string keys = std::string(" --curve-key-dir ") + kK8sCurveDir;
  std::ostringstream o;
  o << "# Kubernetes manifests for the fleet of " << config << "\n"
    << "# Generated by `orrery launch " << config << " --emit k8s`; see docs/launch.md.\n"
    << "# Every tcp socket authenticates with the fleet's CURVE keys, from the Secret " << secret
    << ";\n# create it once, before applying these:\n"
    << "#   orrery fleet keygen keys && kubectl -n " << ns << " create secret generic " << secret
    << " --from-file=keys/\n"
    << "# The run's files live on the volume " << volume << ", mounted at " << kK8sRunMount
    << " in every pod (their working\n# directory; the config's relative paths resolve there): "
    << "put what the config reads by a\n# relative path (model file, data, rl.init) on it.\n"
    << "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " << base
    << "-config\n  namespace: " << ns << "\ndata:\n  run.toml: |\n";
  std::string line;
  while (std::getline(text, line)) o << "    " << line << "\n";
  // ReadWriteMany: pods on different nodes write it at once.
  o << "---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: " << volume
    << "\n  namespace: " << ns << "\nspec:\n  accessModes: [ReadWriteMany]\n";
  if (!fleet.k8s_storage_class.empty()) {
    o << "  storageClassName: " << fleet.k8s_storage_class << "\n";
  }
  o << "  resources:\n    requests: {storage: " << fleet.k8s_storage_size << "}\n";

  // Every process of the fleet runs as an Indexed Job. A Deployment's or StatefulSet's pods can
  // only restart always, without a limit (CrashLoopBackOff forever); a Job's backoffLimit is
  // Kubernetes' restart budget. restartPolicy OnFailure restarts a failed container in place (the
  // same pod, name and IP), a clean exit completes its index (the fleet stopping), and past
  // backoffLimit restarts the Job fails and its pods are stopped. The limit counts the restarts
  // of all the role's instances over the Job's life: fleet.restart_window_s has no equivalent.
  auto job = [&](const std::string& name, const std::string& container, int count,
                 const FleetRoleConfig* role, const std::string& command, int cpus,
                 double memory_gb, int gpus) {
    const bool never = role != nullptr && role->restart == RestartPolicy::kNever;
    o << "---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: " << name
      << "\n  namespace: " << ns << "\nspec:\n  completions: " << count
      << "\n  parallelism: " << count
      << "\n  completionMode: Indexed\n  backoffLimit: " << (never ? 0 : fleet.restart_budget)
      << "\n  template:\n    metadata:\n      labels: {app: " << name
      << "}\n    spec:\n      restartPolicy: " << (never ? "Never" : "OnFailure") << "\n";
    if (role != nullptr) {
      // The coordinator answers once the phases before the fleet are done (pretraining, the
      // initial policy's score, the RL manifest the actors read).
      o << "      initContainers:\n      - name: wait-for-coordinator\n        image: "
        << fleet.k8s_image << "\n        command: [\"/bin/sh\", \"-c\"]\n        args: [\"until "
        << fleet.k8s_orrery << " fleet status --connect " << coord << keys
        << " --timeout-ms 2000 >/dev/null 2>&1; do sleep 2; done\"]\n"
        << "        volumeMounts:\n        - {name: curve, mountPath: " << kK8sCurveDir
        << ", readOnly: true}\n";
    }
    o << "      containers:\n      - name: " << container << "\n        image: " << fleet.k8s_image
      << "\n        workingDir: " << kK8sRunMount
      << "\n        command: [\"/bin/sh\", \"-c\"]\n        args: [\"exec " << fleet.k8s_orrery
      << " " << command << " --config-dir " << kK8sRunMount << keys << "\"]\n"
      << "        env:\n        - name: ORRERY_ADVERTISE_HOST\n          valueFrom:\n"
      << "            fieldRef: {fieldPath: status.podIP}\n"
      << "        resources:\n          requests: {cpu: \"" << cpus << "\", memory: \""
      << static_cast<int>(memory_gb * 1024) << "Mi\"";
    if (gpus > 0) o << ", nvidia.com/gpu: " << gpus;
    o << "}\n";
    if (gpus > 0) o << "          limits: {nvidia.com/gpu: " << gpus << "}\n";
    // The keys are mounted owner-read-only: `orrery` refuses a secret key others could read.
    o << "        volumeMounts:\n        - {name: config, mountPath: /etc/orrery}\n"
      << "        - {name: curve, mountPath: " << kK8sCurveDir << ", readOnly: true}\n"
      << "        - {name: run, mountPath: " << kK8sRunMount << "}\n"
      << "      volumes:\n      - name: config\n        configMap: {name: " << base << "-config}\n"
      << "      - name: curve\n        secret: {secretName: " << secret << ", defaultMode: 0400}\n"
      << "      - name: run\n        persistentVolumeClaim: {claimName: " << volume << "}\n";
  };

  o << "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: " << coord_service
    << "\n  namespace: " << ns << "\nspec:\n  selector: {app: " << coord_service
    << "}\n  ports:\n  - {port: " << fleet.base_port << "}\n";
  job(coord_service, "coordinator", 1, nullptr,
      "launch /etc/orrery/run.toml --external --coordinator 'tcp://*:" +
          std::to_string(fleet.base_port) + "'",
      1, 0.5, 0);
  const std::vector<int> ports = RolePorts(fleet);
  for (size_t i = 0; i < fleet.roles.size(); ++i) {
    const FleetRoleConfig& r = fleet.roles[i];
    if (r.count == 0) continue;
    job(base + "-" + KubeName(r.role), KubeName(r.role), r.count, &r,
        "actor " + r.role + " --index $JOB_COMPLETION_INDEX --endpoint 'tcp://*:" +
            std::to_string(ports[i]) + "' --coordinator " + coord +
            " --config /etc/orrery/run.toml --heartbeat-ms " + std::to_string(fleet.heartbeat_ms) +
            " --progress-timeout-ms " + std::to_string(fleet.progress_timeout_ms) +
            " --max-message-mb " + std::to_string(fleet.max_message_mb),
        r.cpus, r.memory_gb, r.gpus);
  }
  return o.str();
}

}  // namespace

StatusOr<std::string> EmitLaunchFiles(const std::string& kind, const FleetConfig& fleet,
                                      const RunConfig& run, const std::string& config_path) {
  if (kind != "slurm" && kind != "k8s") {
    return InvalidArgumentError("--emit " + kind + ": expected slurm or k8s");
  }
  if (fleet.transport != "tcp") {
    return InvalidArgumentError(config_path + ": fleet.transport: --emit " + kind +
                                " needs \"tcp\" (actors on several machines), got \"" +
                                fleet.transport + "\"");
  }
  std::error_code ec;
  const std::string config = std::filesystem::absolute(config_path, ec).lexically_normal().string();
  if (kind == "slurm") return EmitSlurm(fleet, run, config);
  return EmitK8s(fleet, run, config);
}

}  // namespace orrery
