#include "actors/runtime/client.h"

#include <unistd.h>

#include "actors/runtime/fleet_curve.h"
#include "actors/runtime/wire.h"
#include "core/logging.h"
#include "core/message_limits.h"

namespace orrery {

ActorClient::ActorClient(zmq::context_t& zmq, std::string self_name)
    : zmq_(zmq),
      name_(std::move(self_name)),
      // Distinct per process and client so that a stale reply never matches a new request.
      next_request_id_((static_cast<uint64_t>(getpid()) << 40) ^
                       (reinterpret_cast<uintptr_t>(this) << 8)) {}

ActorClient::~ActorClient() = default;

Status ActorClient::Connect(const std::string& endpoint) {
  try {
    auto socket = std::make_unique<zmq::socket_t>(zmq_, zmq::socket_type::dealer);
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::maxmsgsize, MaxMessageBytes());
    socket->set(zmq::sockopt::reconnect_ivl, 50);
    socket->set(zmq::sockopt::reconnect_ivl_max, 1000);
    SecureFleetSocket(zmq_, *socket, endpoint, SocketSide::kConnect);
    socket->connect(endpoint);
    socket_ = std::move(socket);
    endpoint_ = endpoint;
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError("cannot connect to '" + endpoint + "': " + e.what());
  }
  return Status::OK();
}

StatusOr<Payload> ActorClient::CallRaw(const std::string& method, capnp::MessageBuilder& request,
                                       const CallOptions& options) {
  if (socket_ == nullptr) return FailedPreconditionError(method + ": client not connected");
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + options.timeout;
  Envelope env;
  env.method = method;
  env.request_id = ++next_request_id_;
  env.deadline_unix_ms = UnixMillis() + options.timeout.count();
  env.sender = name_;
  // The DEALER queues while disconnected, so a send only fails when its queue is full.
  Status sent = SendWireMessage(*socket_, nullptr, env, &request);
  if (!sent.ok()) return UnavailableError(method + " to " + endpoint_ + ": " + sent.message());
  while (true) {
    if (options.cancel != nullptr && options.cancel->cancelled()) {
      return CancelledError(method + " to " + endpoint_ + ": cancelled");
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceededError(method + " to " + endpoint_ + ": no reply within " +
                                   std::to_string(options.timeout.count()) + " ms");
    }
    zmq::pollitem_t items[] = {
        {socket_->handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, options.cancel != nullptr ? options.cancel->fd() : -1, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, options.cancel != nullptr ? 2 : 1, left);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return UnavailableError(method + ": poll failed: " + e.what());
    }
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    StatusOr<WireMessage> m = ReceiveWireMessage(*socket_, /*with_identity=*/false);
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kUnavailable) continue;
      return m.status().WithContext(method + " reply from " + endpoint_);
    }
    if (!m->envelope.is_reply || m->envelope.request_id != env.request_id) {
      continue;  // a late reply to an abandoned request
    }
    if (!m->envelope.status.ok()) return m->envelope.status;
    if (m->body.empty()) return InternalError(method + ": OK reply without a body");
    return std::move(m->body);
  }
}

}  // namespace orrery
