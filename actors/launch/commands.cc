#include "actors/launch/commands.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <zmq.hpp>

#include "actors/coordinator/coordinator.h"
#include "actors/coordinator/fleet_state.h"
#include "actors/coordinator/supervisor.h"
#include "actors/launch/embedded_demo_config.h"
#include "actors/launch/emit.h"
#include "actors/launch/fleet_config.h"
#include "actors/launch/plan.h"
#include "actors/launch/run_phases.h"
#include "actors/metrics/metrics_hub.h"
#include "actors/metrics/metrics_publisher.h"
#include "actors/runtime/client.h"
#include "actors/runtime/coordinator_protocol.h"
#include "actors/runtime/curve_auth.h"
#include "actors/runtime/curve_keys.h"
#include "actors/runtime/echo_role.h"
#include "actors/runtime/fleet_curve.h"
#include "actors/runtime/host.h"
#include "actors/runtime/wire.h"
#include "actors/schema/actor.capnp.h"
#include "core/device.h"
#include "core/logging.h"
#include "core/message_limits.h"
#include "core/metrics.h"
#include "core/run_config.h"
#include "core/safetensors.h"

namespace orrery {
namespace {

Cancellation* g_stop = nullptr;

void OnStopSignal(int) {
  if (g_stop != nullptr) g_stop->Cancel();
}

void InstallStopSignals(Cancellation* stop) {
  g_stop = stop;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "orrery" : p.string();
}

struct LoadedFleet {
  RunConfig run;
  FleetConfig fleet;
};

// Validates every section of the file, then reads [run] and [fleet].
StatusOr<LoadedFleet> LoadFleet(const ConfigSections& sections, const std::string& path,
                                const std::string& config_dir = "") {
  {
    ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseFile(path, config_dir));
    ORRERY_RETURN_IF_ERROR(sections.Validate(doc));
    if (!doc.HasTopLevel("fleet")) {
      return InvalidArgumentError(path +
                                  ": no [fleet] section (see configs/fleet/ and docs/launch.md)");
    }
  }
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseFile(path, config_dir));
  ConfigTable root = doc.root();
  LoadedFleet out;
  out.run = ReadRunConfig(root);
  out.fleet = ReadFleetConfig(root, out.run);
  return out;
}

// Writes the fleet's metric records to <run_dir>/fleet_metrics.jsonl and, when configured, to the
// metrics hub (PUB, one JSON record per message). Used from the supervisor's thread only.
class FleetReporter {
 public:
  FleetReporter(zmq::context_t& zmq, FleetState& fleet, const std::string& run_dir,
                const std::string& hub)
      : fleet_(fleet) {
    auto file = MetricsFileWriter::Open(run_dir + "/fleet_metrics.jsonl");
    if (file.ok()) {
      file_ = std::move(file).value();
    } else {
      ORRERY_LOG(WARN) << "fleet metrics file: " << file.status().message();
    }
    if (!hub.empty()) {
      try {
        pub_ = std::make_unique<zmq::socket_t>(zmq, zmq::socket_type::pub);
        pub_->set(zmq::sockopt::linger, 0);
        pub_->set(zmq::sockopt::maxmsgsize, MaxMessageBytes());
        SecureFleetSocket(zmq, *pub_, hub, SocketSide::kConnect);
        pub_->connect(hub);
      } catch (const zmq::error_t& e) {
        ORRERY_LOG(WARN) << "metrics hub " << hub << ": " << e.what();
        pub_.reset();
      }
    }
  }
  void Report() {
    for (const MetricRecord& r : fleet_.ToMetrics(step_, CurveRefusedTotal())) {
      if (file_) (void)file_->Write(r);
      if (pub_) {
        const std::string json = r.ToJson();
        try {
          pub_->send(zmq::buffer(json), zmq::send_flags::dontwait);
        } catch (const zmq::error_t&) {
        }
      }
    }
    ++step_;
  }

 private:
  FleetState& fleet_;
  std::unique_ptr<MetricsFileWriter> file_;
  std::unique_ptr<zmq::socket_t> pub_;
  int64_t step_ = 0;
};

// Without a CONFIG argument: writes the embedded configs/demo.toml to <run.dir>/launch.toml and
// returns that path; its relative paths resolve against ./configs (the repository's).
StatusOr<std::string> WriteEmbeddedDemoConfig(const std::string& config_dir) {
  ORRERY_ASSIGN_OR_RETURN(
      ConfigDocument doc,
      ConfigDocument::ParseString(kEmbeddedDemoConfig, "<embedded configs/demo.toml>", config_dir));
  ConfigTable root = doc.root();
  const std::string run_dir = ReadRunConfig(root).dir;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) return IoError("cannot create " + run_dir + ": " + ec.message());
  const std::string path = run_dir + "/launch.toml";
  ORRERY_RETURN_IF_ERROR(WriteFileAtomic(path, kEmbeddedDemoConfig));
  return path;
}

int RunLaunch(const ConfigSections& sections, const CliArgs& args) {
  std::string path = args.Get("config");
  std::string config_dir = args.Get("config-dir");
  if (path.empty()) {
    std::error_code ec;
    config_dir = (std::filesystem::current_path(ec) / "configs").string();
    if (!std::filesystem::is_regular_file(config_dir + "/model/tiny.toml", ec)) {
      return ReportError(NotFoundError(
          "no CONFIG given, and the embedded configs/demo.toml needs the repository's configs/ "
          "directory here (" +
          config_dir +
          "/model/tiny.toml): run from the repository root or "
          "pass a config"));
    }
    StatusOr<std::string> written = WriteEmbeddedDemoConfig(config_dir);
    if (!written.ok()) return ReportError(written.status());
    path = *written;
    std::printf("orrery launch: no config given: running the embedded configs/demo.toml (%s)\n",
                path.c_str());
  }
  StatusOr<LoadedFleet> loaded = LoadFleet(sections, path, config_dir);
  if (!loaded.ok()) return ReportError(loaded.status());
  // --curve-key-dir: the rendered cluster scripts give every process the same directory.
  if (!args.Get("curve-key-dir").empty()) loaded->fleet.curve_key_dir = args.Get("curve-key-dir");
  const FleetConfig& fleet = loaded->fleet;
  SetMaxMessageBytes(fleet.max_message_mb << 20);
  const std::string emit = args.Get("emit");
  if (!emit.empty()) {
    StatusOr<std::string> text = EmitLaunchFiles(emit, fleet, loaded->run, path);
    if (!text.ok()) return ReportError(text.status());
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  StatusOr<FleetPlan> plan = BuildFleetPlan(fleet, loaded->run, path, SelfExe());
  if (!plan.ok()) return ReportError(plan.status().WithContext(path));
  if (!config_dir.empty()) {
    for (ProcessSpec& p : plan->processes) {
      p.argv.push_back("--config-dir");
      p.argv.push_back(config_dir);
    }
  }
  // A cluster's coordinator binds tcp://*:PORT while actors connect to its host name.
  if (args.Has("coordinator")) plan->coordinator = args.Get("coordinator");
  if (args.Flag("dry-run")) {
    std::fputs(FormatFleetPlan(*plan).c_str(), stdout);
    return 0;
  }
  const bool external = args.Flag("external");
  // The RL roles' model on the GPU ([run] device = "cuda"): one line before anything starts.
  if (!external && loaded->run.device == RunDevice::kCuda && CudaDeviceCount() == 0) {
    return ReportError(FailedPreconditionError(
        path + ": run.device = \"cuda\": no CUDA device is visible to this process" +
        (CudaCompiledIn() ? "" : " (this build has no CUDA support)") +
        "; set device = \"cpu\" to run the fleet on the CPU"));
  }
  FleetPlan to_check = *plan;
  if (external) to_check.processes.clear();  // they run elsewhere
  if (Status s = PreflightFleet(to_check); !s.ok()) return ReportError(s.WithContext(path));
  if (!plan->curve_key_dir.empty()) {
    // Configured keys must exist (they are shared with other machines); the default directory
    // under run.dir is filled on first launch and reused when the run is launched again.
    bool generated = false;
    StatusOr<CurveKeyPair> keys = fleet.curve_key_dir.empty()
                                      ? EnsureCurveKeyDir(plan->curve_key_dir, &generated)
                                      : ReadCurveKeyDir(plan->curve_key_dir);
    if (!keys.ok()) {
      return ReportError(keys.status().WithContext(
          fleet.curve_key_dir.empty() ? path : path + ": fleet.curve_key_dir"));
    }
    SetFleetCurveKeys(*keys);
    if (generated) {
      std::printf("orrery launch: generated the fleet's CURVE keys in %s\n",
                  plan->curve_key_dir.c_str());
      std::fflush(stdout);
    }
  }

  SetProcessLogPrefix("launch");
  Cancellation stop;
  InstallStopSignals(&stop);
  StatusOr<RunPhases> phases = RunPhases::Load({path, config_dir, loaded->run, args.Flag("sync")});
  if (!phases.ok()) return ReportError(phases.status());
  std::unique_ptr<MetricsHub> hub;
  if (fleet.dashboard) {
    MetricsHubOptions o;
    o.store_dir = plan->run_dir + "/metrics_db";
    o.listen = {fleet.metrics_endpoint};
    o.http.port = fleet.dashboard_port;
    o.http.title = loaded->run.name;
    StatusOr<std::unique_ptr<MetricsHub>> started = MetricsHub::Start(o);
    if (!started.ok()) return ReportError(started.status().WithContext("dashboard"));
    hub = std::move(started).value();
    std::printf("dashboard: %s (metrics hub at %s)\n", hub->url().c_str(),
                fleet.metrics_endpoint.c_str());
    std::fflush(stdout);
  }
  // Pretraining runs in this process: its records go to the hub too (PUB to the hub's endpoint;
  // RUN/pretrain/metrics.jsonl stays the durable copy).
  std::unique_ptr<MetricsPublisher> live;
  if (hub) {
    StatusOr<std::unique_ptr<MetricsPublisher>> opened =
        MetricsPublisher::Open({"", fleet.metrics_endpoint});
    if (!opened.ok()) return ReportError(opened.status().WithContext("dashboard"));
    live = std::move(opened).value();
  }
  auto on_metric = [&live](const MetricRecord& m) {
    // Without a file Publish cannot fail; the hub may drop a record, metrics.jsonl keeps it.
    if (live) (void)live->Publish(m);
  };
  if (Status s = phases->BeforeFleet(on_metric); !s.ok()) return ReportError(s);
  if (stop.cancelled()) return ReportError(CancelledError("stopped before the fleet started"));
  zmq::context_t zmq;
  FleetState state;
  StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(zmq, plan->coordinator, state);
  if (!server.ok()) return ReportError(server.status());
  ORRERY_LOG(INFO) << "coordinator at " << (*server)->endpoint() << "; run dir " << plan->run_dir;
  FleetReporter reporter(zmq, state, plan->run_dir, fleet.metrics_endpoint);

  Status result;
  bool rl_done = false;
  if (external) {
    ORRERY_LOG(INFO) << "external mode: actors are started by the cluster; Ctrl-C stops the fleet";
    while (!stop.WaitFor(std::chrono::milliseconds(fleet.metrics_interval_ms))) {
      reporter.Report();
      if (phases->rl() && RunPhases::FleetDone(state.run_state().phase)) {
        ORRERY_LOG(INFO) << "the learner reached its last version: stopping the fleet";
        rl_done = true;
        break;
      }
    }
    state.SetStopping();
    // Actors learn of the stop with their next heartbeat.
    usleep(static_cast<useconds_t>(3 * fleet.heartbeat_ms) * 1000);
  } else {
    SupervisorOptions options;
    options.heartbeat_timeout = std::chrono::milliseconds(fleet.heartbeat_timeout_ms);
    options.startup_timeout = std::chrono::milliseconds(fleet.startup_timeout_ms);
    options.progress_timeout = std::chrono::milliseconds(fleet.progress_timeout_ms);
    options.backoff_initial = std::chrono::milliseconds(fleet.restart_backoff_ms);
    options.backoff_max = std::chrono::milliseconds(fleet.restart_backoff_max_ms);
    options.restart_budget = fleet.restart_budget;
    options.restart_window = std::chrono::seconds(fleet.restart_window_s);
    options.shutdown_grace = std::chrono::milliseconds(fleet.shutdown_grace_ms);
    options.report_interval = std::chrono::milliseconds(fleet.metrics_interval_ms);
    options.report = [&] {
      reporter.Report();
      if (phases->rl() && RunPhases::FleetDone(state.run_state().phase) && !stop.cancelled()) {
        ORRERY_LOG(INFO) << "the learner reached its last version: stopping the fleet";
        rl_done = true;
        stop.Cancel();
      }
    };
    Supervisor supervisor(state, options, plan->processes);
    result = supervisor.Run(stop);
  }
  (*server)->Stop();
  g_stop = nullptr;
  if (!result.ok()) return ReportError(result);
  ORRERY_LOG(INFO) << "fleet stopped";
  if (rl_done) {
    if (Status s = phases->AfterFleet(hub ? hub->url() : ""); !s.ok()) return ReportError(s);
  }
  return 0;
}

// Reads the fleet's CURVE keys from `dir` for this process's sockets. Without a directory, a tcp
// endpoint among `endpoints` is an error: a member of the fleet never talks plain tcp.
Status UseCurveKeyDir(const std::string& dir, const std::vector<std::string>& endpoints,
                      const std::string& flags) {
  if (dir.empty()) {
    for (const std::string& e : endpoints) {
      if (EndpointUsesCurve(e)) {
        return InvalidArgumentError(flags + " " + e +
                                    ": a tcp endpoint of the fleet needs its CURVE keys: give "
                                    "--curve-key-dir DIR (`orrery fleet keygen DIR` makes them)");
      }
    }
    return Status::OK();
  }
  return UseFleetCurveKeyDir(dir);
}

int RunFleetKeygen(const CliArgs& args) {
  const std::string dir = args.Get("dir");
  bool generated = false;
  StatusOr<CurveKeyPair> keys = EnsureCurveKeyDir(dir, &generated);
  if (!keys.ok()) return ReportError(keys.status());
  std::printf("%s: %s (public key %s)\n", dir.c_str(),
              generated ? "generated the fleet's CURVE keys" : "kept the existing CURVE keys",
              keys->public_key.c_str());
  return 0;
}

int RunActorCommand(const CliArgs& args) {
  ActorHostOptions options;
  options.role = args.Get("role");
  options.index = static_cast<int>(args.Int("index", 0));
  options.endpoint = args.Get("endpoint");
  options.coordinator = args.Get("coordinator");
  options.config_path = args.Get("config");
  options.config_dir = args.Get("config-dir");
  options.heartbeat = std::chrono::milliseconds(args.Int("heartbeat-ms", 500));
  if (options.heartbeat.count() < 10) {
    return ReportError(InvalidArgumentError("--heartbeat-ms: expected at least 10"));
  }
  options.progress_timeout = std::chrono::milliseconds(args.Int("progress-timeout-ms", 0));
  if (options.progress_timeout.count() < 0) {
    return ReportError(
        InvalidArgumentError("--progress-timeout-ms: expected 0 (off) or more, got " +
                             std::to_string(options.progress_timeout.count())));
  }
  if (args.Int("max-message-mb") < 1 || args.Int("max-message-mb") > (1 << 20)) {
    return ReportError(InvalidArgumentError("--max-message-mb: expected 1 to 1048576, got " +
                                            std::to_string(args.Int("max-message-mb"))));
  }
  SetMaxMessageBytes(args.Int("max-message-mb") << 20);
  if (Status s = UseCurveKeyDir(args.Get("curve-key-dir"), {options.endpoint, options.coordinator},
                                "--endpoint/--coordinator");
      !s.ok()) {
    return ReportError(s);
  }
  if (!options.config_path.empty()) {
    // One actor per process: [run] (threads, log level) applies to the whole process.
    StatusOr<ConfigDocument> doc =
        ConfigDocument::ParseFile(options.config_path, options.config_dir);
    if (!doc.ok()) return ReportError(doc.status());
    ConfigTable root = doc->root();
    const RunConfig run = ReadRunConfig(root);
    ApplyRunConfig(run);
    options.run_dir = run.dir;
  }
  if (args.Has("run-dir")) options.run_dir = args.Get("run-dir");
  SetProcessLogPrefix(options.role + ":" + std::to_string(options.index));
  Cancellation stop;
  InstallStopSignals(&stop);
  zmq::context_t zmq;
  Status s = RunActor(zmq, options, stop);
  g_stop = nullptr;
  return s.ok() ? 0 : ReportError(s);
}

std::string FormatAge(int64_t unix_ms) {
  if (unix_ms == 0) return "never";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fs ago", (UnixMillis() - unix_ms) / 1000.0);
  return buf;
}

int RunFleetStatus(const ConfigSections& sections, const CliArgs& args) {
  std::string address = args.Get("connect");
  std::string curve_key_dir;
  if (address.empty() && args.Has("config")) {
    StatusOr<LoadedFleet> loaded = LoadFleet(sections, args.Get("config"));
    if (!loaded.ok()) return ReportError(loaded.status());
    StatusOr<FleetPlan> plan = BuildFleetPlan(loaded->fleet, loaded->run, args.Get("config"), "");
    if (!plan.ok()) return ReportError(plan.status());
    address = plan->coordinator;
    curve_key_dir = plan->curve_key_dir;
  }
  if (!args.Get("curve-key-dir").empty()) curve_key_dir = args.Get("curve-key-dir");
  if (Status s = UseCurveKeyDir(curve_key_dir, {address}, "--connect"); !s.ok()) {
    return ReportError(s);
  }
  if (address.empty()) {
    return ReportError(
        InvalidArgumentError("give the coordinator: --connect ADDR or --config FILE"));
  }
  zmq::context_t zmq;
  ActorClient client(zmq, "fleet-status");
  if (Status s = client.Connect(address); !s.ok()) return ReportError(s);
  auto reply = client.Call<schema::Empty, schema::FleetStatus>(
      coordinator_methods::kStatus, [](schema::Empty::Builder) {},
      CallOptions{std::chrono::milliseconds(args.Int("timeout-ms", 3000)), nullptr});
  if (!reply.ok()) {
    return ReportError(UnavailableError("no coordinator answered at " + address + ": " +
                                        reply.status().message()));
  }
  auto st = reply->get();
  auto rs = st.getRunState();
  std::printf("phase %s  stage %u  policy version %llu%s\n", rs.getPhase().cStr(), rs.getStage(),
              static_cast<unsigned long long>(rs.getPolicyVersion()),
              rs.getStopping() ? "  (stopping)" : "");
  std::printf("%-14s %-9s %-8s %8s %8s  %-12s %-12s %-40s %s\n", "ACTOR", "ROLE", "STATE", "PID",
              "RESTARTS", "HEARTBEAT", "PROGRESS", "ENDPOINT", "LAST EXIT");
  for (auto a : st.getActors()) {
    std::printf("%-14s %-9s %-8s %8lld %8u  %-12s %-12s %-40s %s\n", a.getName().cStr(),
                a.getRole().cStr(), a.getState().cStr(), static_cast<long long>(a.getPid()),
                a.getRestarts(), FormatAge(a.getLastHeartbeatUnixMs()).c_str(),
                FormatAge(a.getLastProgressUnixMs()).c_str(), a.getEndpoint().cStr(),
                a.getLastExit().size() ? a.getLastExit().cStr() : "-");
  }
  return 0;
}

}  // namespace

void RegisterFleetCommands(CliRegistry& registry) {
  RegisterEchoRole();
  registry.config_sections().Add("fleet", [](ConfigTable& root) {
    RunConfig run;
    ReadFleetConfig(root, run);
  });
  registry.config_sections().AddKeyExample("[[fleet.roles]]\nrole = \"replay\"\n");
  const ConfigSections* sections = &registry.config_sections();

  registry.Add(CliCommand{
      {"launch"},
      "Start a fleet: the coordinator spawns and supervises every actor of [fleet]",
      {{"CONFIG",
        "the run's TOML file (with a [fleet] section); none: the embedded configs/demo.toml",
        CliKind::kString, false, ""},
       {"--dry-run", "print the process plan (actor, endpoint, command line) and exit",
        CliKind::kFlag, false, ""},
       {"--emit", "print cluster launch files instead of launching: slurm or k8s", CliKind::kString,
        false, ""},
       {"--external", "run only the coordinator; the actors are started by a cluster scheduler",
        CliKind::kFlag, false, ""},
       {"--coordinator", "bind the coordinator here instead of fleet.coordinator", CliKind::kString,
        false, ""},
       {"--curve-key-dir", "the fleet's CURVE keys, instead of fleet.curve_key_dir",
        CliKind::kString, false, ""},
       {"--config-dir",
        "resolve the config's relative paths here instead of against its own directory (the "
        "actors get it too)",
        CliKind::kString, false, ""},
       {"--sync", "RL phase: rollouts wait for every policy update (on-policy baseline)",
        CliKind::kFlag, false, ""}},
      [sections](const CliArgs& args) { return RunLaunch(*sections, args); }});

  std::string roles_help = "the role to run";
  registry.Add(CliCommand{
      {"actor"},
      "Run one actor instance (what `orrery launch` spawns; roles: see docs/actors.md)",
      {{"ROLE", roles_help, CliKind::kString, true, ""},
       {"--index", "instance number within the role", CliKind::kInt, false, "0"},
       {"--endpoint", "the mailbox address to bind (inproc://, ipc://, tcp://)", CliKind::kString,
        true, ""},
       {"--coordinator", "the coordinator's endpoint (none: run standalone)", CliKind::kString,
        false, ""},
       {"--config", "the run's TOML file", CliKind::kString, false, ""},
       {"--config-dir", "resolve the config's relative paths here (default: its directory)",
        CliKind::kString, false, ""},
       {"--run-dir", "run directory (default: [run].dir of --config)", CliKind::kString, false, ""},
       {"--heartbeat-ms", "heartbeat period", CliKind::kInt, false, "500"},
       {"--progress-timeout-ms",
        "end this process (exit 75) when its role's progress counter stalls this long (0: off)",
        CliKind::kInt, false, "0"},
       {"--max-message-mb", "the largest ZeroMQ message any socket of the actor accepts",
        CliKind::kInt, false, "1024"},
       {"--curve-key-dir", "the fleet's CURVE keys (fleet.key): required with tcp endpoints",
        CliKind::kString, false, ""}},
      [](const CliArgs& args) { return RunActorCommand(args); }});

  registry.AddGroup({"fleet"}, "Inspect a running fleet");
  registry.Add(CliCommand{
      {"fleet", "status"},
      "List the actors of a running fleet: state, pid, restarts, last heartbeat",
      {{"--connect", "the coordinator's endpoint", CliKind::kString, false, ""},
       {"--config", "or: the fleet's config file (its coordinator endpoint)", CliKind::kString,
        false, ""},
       {"--timeout-ms", "how long to wait for the coordinator", CliKind::kInt, false, "3000"},
       {"--curve-key-dir", "the fleet's CURVE keys (a tcp coordinator; default with --config: its)",
        CliKind::kString, false, ""}},
      [sections](const CliArgs& args) { return RunFleetStatus(*sections, args); }});
  registry.Add(CliCommand{
      {"fleet", "keygen"},
      "Write a fleet's CURVE keypair (fleet.key 0600, fleet.pub) into DIR, unless it has one",
      {{"DIR", "the key directory (fleet.curve_key_dir; a k8s Secret's files)", CliKind::kString,
        true, ""}},
      [](const CliArgs& args) { return RunFleetKeygen(args); }});
}

}  // namespace orrery
