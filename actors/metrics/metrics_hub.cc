#include "actors/metrics/metrics_hub.h"

#include <zmq.hpp>

#include "actors/runtime/fleet_curve.h"
#include "core/logging.h"
#include "core/message_limits.h"

namespace orrery {

struct MetricsHub::Zmq {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::sub};
};

StatusOr<std::unique_ptr<MetricsHub>> MetricsHub::Start(const MetricsHubOptions& options) {
  if (options.listen.empty() && options.connect.empty()) {
    return InvalidArgumentError(
        "metrics hub: give at least one endpoint to listen on or connect to");
  }
  std::unique_ptr<MetricsHub> self(new MetricsHub());
  ORRERY_ASSIGN_OR_RETURN(self->store_, MetricsStore::Open(options.store_dir));
  self->zmq_ = std::make_unique<Zmq>();
  zmq::socket_t& sock = self->zmq_->socket;
  try {
    sock.set(zmq::sockopt::subscribe, "");
    sock.set(zmq::sockopt::rcvtimeo, 100);  // the loop checks for Stop() this often
    sock.set(zmq::sockopt::linger, 0);
    sock.set(zmq::sockopt::maxmsgsize, MaxMessageBytes());
    sock.set(zmq::sockopt::rcvhwm, 100000);
    for (const std::string& ep : options.listen) {
      SecureFleetSocket(self->zmq_->context, sock, ep, SocketSide::kBind);
      sock.bind(ep);
      self->bound_.push_back(sock.get(zmq::sockopt::last_endpoint));
    }
    for (const std::string& ep : options.connect) {
      SecureFleetSocket(self->zmq_->context, sock, ep, SocketSide::kConnect);
      sock.connect(ep);
    }
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError(std::string("metrics hub: endpoint: ") + e.what());
  }
  ORRERY_ASSIGN_OR_RETURN(
      self->server_, DashboardServer::Start(self->store_.get(), &self->counters_, options.http));
  self->receiver_ = std::thread([hub = self.get()] { hub->ReceiveLoop(); });
  return self;
}

void MetricsHub::ReceiveLoop() {
  ScopedLogPrefix prefix("metrics-hub");
  while (!stop_.load()) {
    zmq::message_t msg;
    zmq::recv_result_t got;
    try {
      got = zmq_->socket.recv(msg, zmq::recv_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      ORRERY_LOG(WARN) << "receive failed: " << e.what();
      continue;
    }
    if (!got) continue;  // timeout
    StatusOr<MetricRecord> r = MetricRecord::FromJson(msg.to_string());
    Status s = r.ok() ? store_->Append(*r) : r.status();
    if (s.ok()) {
      counters_.received.fetch_add(1);
    } else {
      // Rate-limited by the counter: one line for the first and every 1000th bad message.
      const uint64_t n = counters_.rejected.fetch_add(1);
      if (n % 1000 == 0) ORRERY_LOG(WARN) << "rejected metric message: " << s.ToString();
    }
  }
}

void MetricsHub::Stop() {
  stop_.store(true);
  if (receiver_.joinable()) receiver_.join();
  if (server_) server_->Stop();
}

MetricsHub::~MetricsHub() { Stop(); }

}  // namespace orrery
