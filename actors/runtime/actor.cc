#include "actors/runtime/actor.h"

#include <algorithm>

#include "actors/runtime/fleet_curve.h"
#include "actors/runtime/wire.h"
#include "core/logging.h"
#include "core/message_limits.h"

namespace orrery {

Actor::Actor(zmq::context_t& zmq, std::string name)
    : name_(std::move(name)), zmq_(zmq), socket_(zmq, zmq::socket_type::router) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::maxmsgsize, MaxMessageBytes());
  // A reply to a caller that has gone away is dropped, never blocks the loop.
  socket_.set(zmq::sockopt::router_mandatory, 0);
}

Actor::~Actor() = default;

Status Actor::Bind(const std::string& endpoint) {
  try {
    SecureFleetSocket(zmq_, socket_, endpoint, SocketSide::kBind);
    socket_.bind(endpoint);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return UnavailableError("actor " + name_ + ": cannot bind " + endpoint + ": " + e.what());
  }
  return Status::OK();
}

void Actor::HandleRaw(const std::string& method, RawHandler handler) {
  handlers_[method] = std::move(handler);
}

void Actor::Every(std::chrono::milliseconds period, std::function<void()> fn) {
  timers_.push_back(Timer{period, std::chrono::steady_clock::now() + period, std::move(fn)});
}

void Actor::ServeOne(const Cancellation& stop) {
  StatusOr<WireMessage> received = ReceiveWireMessage(socket_, /*with_identity=*/true);
  if (!received.ok()) {
    if (received.status().code() != StatusCode::kUnavailable) {
      ORRERY_LOG(WARN) << "dropped a malformed message: " << received.status().message();
    }
    return;
  }
  WireMessage& m = *received;
  if (m.envelope.is_reply) {
    ORRERY_LOG(WARN) << "dropped a stray reply from " << m.envelope.sender;
    return;
  }
  Envelope reply_env;
  reply_env.method = m.envelope.method;
  reply_env.request_id = m.envelope.request_id;
  reply_env.sender = name_;
  reply_env.is_reply = true;
  capnp::MallocMessageBuilder reply;
  Status status;
  auto it = handlers_.find(m.envelope.method);
  if (it == handlers_.end()) {
    status = UnimplementedError("actor " + name_ + " has no method '" + m.envelope.method + "'");
  } else if (m.envelope.deadline_unix_ms != 0 && UnixMillis() > m.envelope.deadline_unix_ms) {
    status = DeadlineExceededError(m.envelope.method + ": deadline passed before it was served");
  } else if (m.body.empty()) {
    status = InvalidArgumentError(m.envelope.method + ": request without a body");
  } else {
    RequestInfo info{m.envelope.sender, m.envelope.deadline_unix_ms, &stop};
    status = CatchAll(m.envelope.method, [&] { return it->second(m.body, info, reply); });
  }
  if (status.ok()) {
    ++served_;
  } else if (status.code() != StatusCode::kDeadlineExceeded &&
             status.code() != StatusCode::kCancelled) {
    ORRERY_LOG(DEBUG) << m.envelope.method << " from " << m.envelope.sender
                      << " failed: " << status.ToString();
  }
  reply_env.status = status;
  Status sent = SendWireMessage(socket_, &m.identity, reply_env, status.ok() ? &reply : nullptr);
  if (!sent.ok()) ORRERY_LOG(WARN) << "reply to " << m.envelope.sender << ": " << sent.message();
}

Status Actor::Run(const Cancellation& stop) {
  if (endpoint_.empty()) return FailedPreconditionError("actor " + name_ + ": Run before Bind");
  while (!stop.cancelled()) {
    auto now = std::chrono::steady_clock::now();
    long wait_ms = 1000;
    for (Timer& t : timers_) {
      if (t.next <= now) {
        Status s = CatchAll("timer", [&] {
          t.fn();
          return Status::OK();
        });
        if (!s.ok()) ORRERY_LOG(ERROR) << s.message();
        t.next = std::max(t.next + t.period, now);
      }
      wait_ms = std::min<long>(
          wait_ms, std::chrono::duration_cast<std::chrono::milliseconds>(t.next - now).count());
    }
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, stop.fd(), ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(std::max<long>(wait_ms, 0)));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return UnavailableError("actor " + name_ + ": poll failed: " + e.what());
    }
    if (items[0].revents & ZMQ_POLLIN) {
      // Drain what is queued, but stay responsive to timers and stop.
      for (int i = 0; i < 64 && !stop.cancelled(); ++i) {
        if (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLIN)) break;
        ServeOne(stop);
      }
    }
  }
  return Status::OK();
}

}  // namespace orrery
