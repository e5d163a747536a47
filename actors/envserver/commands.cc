#include "actors/envserver/commands.h"

#include <csignal>
#include <cstdio>

#include "actors/runtime/fleet_curve.h"
#include "actors/runtime/role.h"
#include "core/logging.h"
#include "env/registry.h"

namespace orrery::envserver {
namespace {

Cancellation* g_stop = nullptr;
void OnStopSignal(int) {
  if (g_stop != nullptr) g_stop->Cancel();  // async-signal-safe
}

std::string Joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The "env" role: one environment worker of a fleet, at the endpoint the fleet chose.
Status EnvMain(ActorContext& ctx) {
  return ServeEnvs(
      ctx.zmq(), ctx.name(), ctx.config_root(), ctx.endpoint(), ctx.stop(),
      [&ctx](const EnvServer&) { ctx.SetReady(); }, [&ctx] { ctx.Progress(); });
}

int Serve(const CliArgs& args, const ConfigSections* sections) {
  const std::string path = args.Get("config");
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseFile(path);
  if (!doc.ok()) return ReportError(doc.status());
  // Every section of the file is checked first (unknown keys included), as `orrery config
  // check` would.
  if (Status s = sections->Validate(*doc); !s.ok()) return ReportError(s);
  StatusOr<ConfigDocument> fresh = ConfigDocument::ParseFile(path);
  if (!fresh.ok()) return ReportError(fresh.status());
  ConfigTable root = fresh->root();
  std::string endpoint = args.Get("listen");
  if (endpoint.empty()) endpoint = ReadEnvServerOptions(root).listen;
  if (Status s = UseStandaloneServerKeys(endpoint, args.Get("curve-key-dir"),
                                         args.Flag("insecure-plain-tcp"));
      !s.ok()) {
    return ReportError(s.WithContext("env serve"));
  }
  SetProcessLogPrefix("env:0");
  Cancellation stop;
  g_stop = &stop;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  zmq::context_t zmq;
  Status s = ServeEnvs(zmq, "env:0", fresh->root(), endpoint, stop, [](const EnvServer& server) {
    std::printf("env: serving %s on %s (incarnation %016llx)\n", Joined(server.env_names()).c_str(),
                server.endpoint().c_str(), static_cast<unsigned long long>(server.incarnation()));
    std::fflush(stdout);
  });
  g_stop = nullptr;
  return s.ok() ? 0 : ReportError(s);
}

}  // namespace

Status ServeEnvs(zmq::context_t& zmq, const std::string& name, ConfigTable root,
                 const std::string& endpoint, const Cancellation& stop,
                 const std::function<void(const EnvServer&)>& on_ready,
                 const std::function<void()>& on_iteration) {
  EnvServerOptions options = ReadEnvServerOptions(root);
  env::EnvRegistry registry;
  env::RegisterBuiltinEnvs(registry);
  ORRERY_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<env::Env>> envs,
                          CreateServedEnvs(root, options, registry));
  EnvServer server(zmq, name, std::move(envs), options);
  ORRERY_RETURN_IF_ERROR(server.Bind(endpoint));
  ORRERY_LOG(INFO) << "serving " << Joined(server.env_names()) << " on " << server.endpoint()
                   << " (" << options.workers << " workers)";
  on_ready(server);
  return server.Run(stop, on_iteration);
}

void RegisterEnvServerCommands(CliRegistry& registry) {
  registry.config_sections().Add("env_server",
                                 [](ConfigTable& root) { ReadEnvServerOptions(root); });
  RegisterActorRole({"env", "an environment worker: hosts episodes for rollout actors", EnvMain});
  const ConfigSections* sections = &registry.config_sections();
  registry.Add(CliCommand{
      {"env", "serve"},
      "Host the environments of a config for remote rollout actors (ZeroMQ + Cap'n Proto)",
      {{"--config", "TOML file with [env] (and optionally [env_server])", CliKind::kString, true,
        ""},
       {"--listen", "endpoint to bind (default: env_server.listen)", CliKind::kString, false, ""},
       {"--curve-key-dir", "CURVE keys: clients must hold the same (needed beyond loopback)",
        CliKind::kString, false, ""},
       {"--insecure-plain-tcp", "serve plain tcp beyond loopback without keys", CliKind::kFlag,
        false, ""}},
      [sections](const CliArgs& args) { return Serve(args, sections); }});
}

}  // namespace orrery::envserver
