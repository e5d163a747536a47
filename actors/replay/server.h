// ReplayServer: the replay actor's ZeroMQ loop. A ROUTER socket receives ReplayRequests from any
// number of DEALER (or REQ) clients and hands them to a ReplayService; replies go back to the
// sender. The loop never blocks on a table: blocked calls are parked by the service, and inserts
// waiting for their group-commit fsync are released when the syncer signals the loop.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <zmq.hpp>

#include "actors/replay/service.h"
#include "actors/replay/store.h"

namespace orrery::replay {

class ReplayServer {
 public:
  ReplayServer(ReplayStore* store, zmq::context_t& context);
  ~ReplayServer();

  // Binds `endpoint` (tcp://host:port, tcp://127.0.0.1:* for any port, ipc://, inproc://); tcp as a
  // CURVE server when the process has the fleet's keys (actors/runtime/fleet_curve.h).
  Status Bind(const std::string& endpoint);
  // The bound endpoint with the real port.
  std::string endpoint() const;
  // Serves until `should_stop` returns true (checked at least every 50 ms), then answers every
  // parked request with Cancelled.
  Status Run(const std::function<bool()>& should_stop);

 private:
  void Send(const std::string& peer, kj::Array<capnp::word> reply);

  ReplayStore* store_;
  zmq::context_t& context_;
  zmq::socket_t socket_;
  std::unique_ptr<ReplayService> service_;
  std::unordered_set<std::string> req_peers_;  // REQ clients: replies need an empty delimiter
  // Signalled by the storage's syncer after each group-commit fsync; polled beside the socket so
  // a durable insert is acknowledged at once rather than at the next poll timeout.
  int durable_fd_ = -1;
};

}  // namespace orrery::replay
