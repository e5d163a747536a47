// The metrics hub actor: subscribes to every actor's metric records over ZeroMQ, stores them in a
// durable RocksDB MetricsStore and serves the dashboard and /metrics over HTTP.
//
// Actors' PUB sockets connect to the hub's SUB endpoint (`listen`, bound by the hub), so actors can
// come and go without the hub knowing them; the hub can also connect to PUB sockets that actors
// bind (`connect`). Each message is one MetricRecord JSON line; invalid ones are counted and
// dropped (orrery_metrics_hub_records_rejected_total).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/metrics/dashboard_server.h"
#include "actors/metrics/metrics_store.h"
#include "actors/metrics/prometheus_text.h"
#include "core/status.h"

namespace orrery {

struct MetricsHubOptions {
  std::string store_dir;             // the RocksDB directory (RUN/metrics_db)
  std::vector<std::string> listen;   // SUB endpoints to bind (tcp://127.0.0.1:5570)
  std::vector<std::string> connect;  // PUB endpoints to connect to
  DashboardServerOptions http;
};

class MetricsHub {
 public:
  static StatusOr<std::unique_ptr<MetricsHub>> Start(const MetricsHubOptions& options);
  ~MetricsHub();  // stops

  std::string url() const { return server_->url(); }
  // The endpoints actually bound (a tcp port given as * is resolved).
  const std::vector<std::string>& bound_endpoints() const { return bound_; }
  const MetricsStore& store() const { return *store_; }
  const IngestCounters& counters() const { return counters_; }
  void Stop();

 private:
  MetricsHub() = default;
  void ReceiveLoop();

  std::unique_ptr<MetricsStore> store_;
  IngestCounters counters_;
  std::unique_ptr<DashboardServer> server_;
  struct Zmq;
  std::unique_ptr<Zmq> zmq_;
  std::vector<std::string> bound_;
  std::atomic<bool> stop_{false};
  std::thread receiver_;
};

}  // namespace orrery
