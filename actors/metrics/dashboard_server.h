// The HTTP server of the metrics hub and of `orrery dashboard`: the web dashboard (assets embedded
// in the binary), a small JSON API over a MetricsStore and the Prometheus /metrics endpoint.
//
//   GET /                 the dashboard page (and /app.js, /app.css)
//   GET /api/info         {"title", "now", "last_seq", "records", "series", "actors"}
//   GET /api/series       every series: name, source, array, points, last step and time
//   GET /api/query?name=N[&name=M...][&after=SEQ][&until=SEQ][&max_points=K]
//                         {"seq": until, "series": {N: [{"source", "seq", "time", "step",
//                         "values"}]}}: points with after < seq <= until (default: the last),
//                         for incremental refresh
//   GET /api/actors       every source with its first and last record time and record count
//   GET /metrics          Prometheus text exposition (prometheus_text.h)
//   GET /healthz          "ok"
//
// It listens on 127.0.0.1 unless told otherwise. Any other address needs a bearer token: requests
// then carry `Authorization: Bearer TOKEN`, or the cookie set by opening `/?token=TOKEN` once.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/metrics/metrics_store.h"
#include "actors/metrics/prometheus_text.h"
#include "core/status.h"

namespace httplib {
class Server;
}

namespace orrery {

struct DashboardServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;       // 0: any free port
  std::string token;  // required when host is not a loopback address
  std::string title;  // shown in the page header (the run's name)
  // Host names (without port) a request's Host header may carry besides the loopback names and
  // the bind address: a page of another site that a DNS name rebound to 127.0.0.1 cannot read the
  // dashboard. Bound to a wildcard address (0.0.0.0, ::) with none given, any Host is served (the
  // token then guards it).
  std::vector<std::string> allowed_hosts;
  // PEM certificate (chain) and private key: both or neither. With them the server speaks HTTPS
  // only; without them it is refused beyond loopback, where the token and every chart would cross
  // the network in the clear.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(const std::string& host);

class DashboardServer {
 public:
  // Binds and starts serving on a background thread; returns once the server accepts requests.
  // `store` (and `counters`, which may be null) must outlive the server.
  static StatusOr<std::unique_ptr<DashboardServer>> Start(const MetricsStore* store,
                                                          const IngestCounters* counters,
                                                          const DashboardServerOptions& options);
  ~DashboardServer();  // stops

  int port() const { return port_; }
  // http://HOST:PORT/ (https:// with TLS)
  std::string url() const;
  void Stop();

 private:
  DashboardServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  bool tls_ = false;
  int port_ = 0;
};

}  // namespace orrery
