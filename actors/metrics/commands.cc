#include "actors/metrics/commands.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "actors/metrics/dashboard_server.h"
#include "actors/metrics/metrics_config.h"
#include "actors/metrics/metrics_export.h"
#include "actors/metrics/metrics_hub.h"
#include "actors/metrics/metrics_store.h"
#include "actors/metrics/run_metrics_files.h"
#include "core/logging.h"

namespace orrery {
namespace {

// Blocks SIGINT and SIGTERM in this thread and every thread started after, so that they are only
// taken by WaitForSignal. Call before starting servers.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// True when SIGINT or SIGTERM arrived within `seconds`.
bool WaitForSignal(const sigset_t& set, double seconds) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  return sigtimedwait(&set, nullptr, &ts) > 0;
}

StatusOr<DashboardServerOptions> HttpOptions(const CliArgs& args, const std::string& title) {
  DashboardServerOptions http;
  http.title = title;
  http.host = args.Get("bind", "127.0.0.1");
  const int64_t port = args.Int("port", 0);
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("--port " + std::to_string(port) + ": expected 0..65535");
  }
  http.port = static_cast<int>(port);
  if (args.Has("token-file")) {
    ORRERY_ASSIGN_OR_RETURN(http.token, ReadTokenFile(args.Get("token-file")));
  }
  for (const std::string& h : args.List("allow-host")) {
    if (h.empty() || h.find_first_of(" /\t") != std::string::npos) {
      return InvalidArgumentError("--allow-host '" + h + "': expected a host name such as " +
                                  "dash.example.org");
    }
    http.allowed_hosts.push_back(h);
  }
  http.tls_cert_file = args.Get("tls-cert");
  http.tls_key_file = args.Get("tls-key");
  if (http.tls_cert_file.empty() != http.tls_key_file.empty()) {
    return InvalidArgumentError("--tls-cert and --tls-key: give both (PEM files) or neither");
  }
  if (!IsLoopbackHost(http.host) && (http.token.empty() || http.tls_cert_file.empty())) {
    return InvalidArgumentError("--bind " + http.host +
                                ": serving beyond loopback needs --token-file FILE (a bearer "
                                "token) and --tls-cert FILE --tls-key FILE (HTTPS)");
  }
  return http;
}

std::string RunTitle(const std::string& run_dir) {
  std::string name = std::filesystem::path(run_dir).lexically_normal().filename().string();
  if (name.empty()) {
    name = std::filesystem::path(run_dir).lexically_normal().parent_path().filename().string();
  }
  return name;
}

std::vector<CliOption> HttpCliOptions() {
  return {
      {"--port", "HTTP port (0: any free port; the address is printed)", CliKind::kInt, false, "0"},
      {"--bind", "address to listen on; anything but loopback needs --token-file and TLS",
       CliKind::kString, false, "127.0.0.1"},
      {"--token-file", "file holding the bearer token clients must send", CliKind::kString, false,
       ""},
      {"--tls-cert", "PEM certificate: serve HTTPS (needed beyond loopback)", CliKind::kString,
       false, ""},
      {"--tls-key", "PEM private key of --tls-cert", CliKind::kString, false, ""},
      {"--allow-host",
       "a Host name clients reach the dashboard by, besides loopback and --bind (repeatable)",
       CliKind::kStringList, false, ""},
  };
}

int RunDashboard(const CliArgs& args) {
  const std::string run_dir = args.Get("run");
  const double poll = args.Float("poll-seconds", 1.0);
  if (!(poll > 0 && poll <= 3600)) {
    return ReportError(InvalidArgumentError("--poll-seconds: expected a number in (0, 3600]"));
  }
  StatusOr<std::vector<std::string>> files = FindRunMetricsFiles(run_dir);
  if (!files.ok()) return ReportError(files.status());
  if (files->empty()) {
    return ReportError(NotFoundError(run_dir + ": no metrics.jsonl in the run directory"));
  }
  StatusOr<DashboardServerOptions> http = HttpOptions(args, RunTitle(run_dir));
  if (!http.ok()) return ReportError(http.status());

  MetricsStoreOptions store_options;
  store_options.in_memory = true;
  StatusOr<std::unique_ptr<MetricsStore>> store = MetricsStore::Open("/dashboard", store_options);
  if (!store.ok()) return ReportError(store.status());
  RunMetricsTailer tailer(run_dir);
  IngestCounters counters;
  auto ingest = [&]() -> Status {
    std::vector<MetricRecord> records;
    ORRERY_RETURN_IF_ERROR(tailer.Poll(&records));
    for (const MetricRecord& r : records) {
      if ((*store)->Append(r).ok()) {
        counters.received.fetch_add(1);
      } else {
        counters.rejected.fetch_add(1);
      }
    }
    return Status::OK();
  };
  if (Status s = ingest(); !s.ok()) return ReportError(s);

  const sigset_t signals = BlockShutdownSignals();
  StatusOr<std::unique_ptr<DashboardServer>> server =
      DashboardServer::Start(store->get(), &counters, *http);
  if (!server.ok()) return ReportError(server.status());
  std::printf("dashboard: %s (run %s: %llu records, %lld malformed lines skipped)\n",
              (*server)->url().c_str(), run_dir.c_str(),
              static_cast<unsigned long long>((*store)->records()),
              static_cast<long long>(tailer.malformed_lines()));
  std::fflush(stdout);
  while (!WaitForSignal(signals, poll)) {
    if (Status s = ingest(); !s.ok())
      ORRERY_LOG(WARN) << "reading " << run_dir << ": " << s.ToString();
  }
  (*server)->Stop();
  return 0;
}

int RunExport(const CliArgs& args) {
  StatusOr<ExportFormat> format = ParseExportFormat(args.Get("format"));
  if (!format.ok()) return ReportError(format.status());
  int64_t malformed = 0;
  StatusOr<std::vector<MetricRecord>> records = ReadRunMetrics(args.Get("run"), &malformed);
  if (!records.ok()) return ReportError(records.status());
  if (malformed > 0) {
    std::fprintf(stderr, "orrery export: skipped %lld malformed lines\n",
                 static_cast<long long>(malformed));
  }
  const std::string output = args.Get("output", "-");
  if (output == "-") {
    Status s = WriteExport(*records, *format, std::cout);
    return s.ok() ? 0 : ReportError(s);
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  if (!out) return ReportError(IoError(output + ": cannot open for writing"));
  Status s = WriteExport(*records, *format, out);
  return s.ok() ? 0 : ReportError(s);
}

int RunHub(const CliArgs& args) {
  const std::string run_dir = args.Get("run");
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) return ReportError(IoError(run_dir + ": cannot create run directory: " + ec.message()));
  MetricsHubOptions options;
  options.store_dir = args.Get("store", run_dir + "/metrics_db");
  options.listen = args.List("listen");
  if (args.Has("connect")) options.connect = args.List("connect");
  StatusOr<DashboardServerOptions> http = HttpOptions(args, RunTitle(run_dir));
  if (!http.ok()) return ReportError(http.status());
  options.http = *http;

  const sigset_t signals = BlockShutdownSignals();
  StatusOr<std::unique_ptr<MetricsHub>> hub = MetricsHub::Start(options);
  if (!hub.ok()) return ReportError(hub.status());
  for (const std::string& ep : (*hub)->bound_endpoints()) {
    std::printf("metrics hub: listening for metric records on %s\n", ep.c_str());
  }
  std::printf("dashboard: %s (store %s, %llu records)\n", (*hub)->url().c_str(),
              options.store_dir.c_str(),
              static_cast<unsigned long long>((*hub)->store().records()));
  std::fflush(stdout);
  while (!WaitForSignal(signals, 1.0)) {
  }
  (*hub)->Stop();
  return 0;
}

}  // namespace

void RegisterMetricsCommands(CliRegistry& registry) {
  registry.config_sections().Add("metrics", [](ConfigTable& root) { ReadMetricsConfig(root); });

  std::vector<CliOption> dashboard_options = {
      {"--run", "run directory holding metrics.jsonl (or <actor>/metrics.jsonl)", CliKind::kString,
       true, ""},
      {"--poll-seconds", "how often to read new records (live runs)", CliKind::kFloat, false, "1"},
  };
  for (CliOption& o : HttpCliOptions()) dashboard_options.push_back(o);
  registry.Add(CliCommand{{"dashboard"},
                          "Serve the web dashboard of a run from its metrics.jsonl (live while the "
                          "run goes); Ctrl-C stops",
                          dashboard_options,
                          RunDashboard});

  registry.Add(CliCommand{
      {"export"},
      "Write a run's metrics as CSV (time,source,step,metric,index,value) or JSON lines",
      {{"--run", "run directory holding metrics.jsonl", CliKind::kString, true, ""},
       {"--format", "csv or jsonl", CliKind::kString, true, ""},
       {"-o,--output", "output file ('-': standard output)", CliKind::kString, false, "-"}},
      RunExport});

  registry.AddGroup({"metrics"}, "The metrics hub: collects every actor's metrics");
  std::vector<CliOption> hub_options = {
      {"--run", "run directory (the store goes to RUN/metrics_db)", CliKind::kString, true, ""},
      {"--store", "RocksDB directory of the time series (default RUN/metrics_db)", CliKind::kString,
       false, ""},
      {"--listen", "ZeroMQ SUB endpoint(s) to bind; actors' PUB sockets connect here",
       CliKind::kStringList, false, "tcp://127.0.0.1:5570"},
      {"--connect", "ZeroMQ PUB endpoint(s) of actors to subscribe to", CliKind::kStringList, false,
       ""},
  };
  for (CliOption& o : HttpCliOptions()) hub_options.push_back(o);
  registry.Add(CliCommand{{"metrics", "hub"},
                          "Run the metrics hub: store records from ZeroMQ in RocksDB, serve the "
                          "dashboard and Prometheus /metrics",
                          hub_options,
                          RunHub});
}

}  // namespace orrery
