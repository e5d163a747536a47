#include "actors/replay/server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "actors/runtime/fleet_curve.h"
#include "core/logging.h"

namespace orrery::replay {

ReplayServer::ReplayServer(ReplayStore* store, zmq::context_t& context)
    : store_(store), context_(context), socket_(context, zmq::socket_type::router) {
  socket_.set(zmq::sockopt::linger, 0);
  // ZeroMQ's default high-water marks (1000 messages per peer); parked requests are bounded by
  // the service's own limits.
  socket_.set(zmq::sockopt::sndhwm, 1000);
  socket_.set(zmq::sockopt::rcvhwm, 1000);
  socket_.set(zmq::sockopt::maxmsgsize, store->config().max_message_bytes + 4096);
  service_ = std::make_unique<ReplayService>(
      store, [this](const std::string& peer, kj::Array<capnp::word> reply) {
        Send(peer, std::move(reply));
      });
  durable_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (durable_fd_ >= 0) {
    store_->storage()->SetDurableListener([fd = durable_fd_] {
      const uint64_t one = 1;
      (void)!write(fd, &one, sizeof(one));
    });
  } else {
    // Still correct without it: acks are then released at the loop's 1 ms poll interval.
    ORRERY_LOG(WARN) << "replay: eventfd failed (" << std::strerror(errno)
                     << "); durable inserts are acknowledged at the next poll";
  }
}

ReplayServer::~ReplayServer() {
  if (durable_fd_ >= 0) {
    store_->storage()->SetDurableListener(nullptr);
    close(durable_fd_);
  }
}

Status ReplayServer::Bind(const std::string& endpoint) {
  try {
    SecureFleetSocket(context_, socket_, endpoint, SocketSide::kBind);
    socket_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    return UnavailableError("replay: cannot bind '" + endpoint + "': " + e.what());
  }
  ORRERY_LOG(INFO) << "replay: serving on " << this->endpoint();
  return Status::OK();
}

std::string ReplayServer::endpoint() const { return socket_.get(zmq::sockopt::last_endpoint); }

void ReplayServer::Send(const std::string& peer, kj::Array<capnp::word> reply) {
  // Zero-copy: the message owns the encoded reply until ZeroMQ has sent it.
  auto* owned = new kj::Array<capnp::word>(std::move(reply));
  auto bytes = owned->asBytes();
  zmq::message_t body(
      bytes.begin(), bytes.size(),
      [](void*, void* hint) { delete static_cast<kj::Array<capnp::word>*>(hint); }, owned);
  try {
    socket_.send(zmq::buffer(peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (req_peers_.count(peer)) socket_.send(zmq::message_t(), zmq::send_flags::sndmore);
    socket_.send(body, zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    ORRERY_LOG(WARN) << "replay: reply to a client dropped: " << e.what();
  }
}

Status ReplayServer::Run(const std::function<bool()>& should_stop) {
  std::vector<zmq::message_t> frames;
  while (!should_stop()) {
    int64_t timeout = service_->PollIntervalMs();
    timeout = timeout < 0 ? 50 : std::min<int64_t>(timeout, 50);
    zmq::pollitem_t items[2] = {{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0},
                                {nullptr, durable_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, durable_fd_ >= 0 ? 2 : 1, std::chrono::milliseconds(timeout));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return InternalError(std::string("replay: poll failed: ") + e.what());
    }
    if (durable_fd_ >= 0 && (items[1].revents & ZMQ_POLLIN)) {
      uint64_t count;
      (void)!read(durable_fd_, &count, sizeof(count));  // re-arm; Poll() below releases acks
    }
    zmq::pollitem_t& item = items[0];
    // Drain what is queued (bounded, so deadlines and acks are served in between).
    for (int n = 0; n < 256 && (item.revents & ZMQ_POLLIN); ++n) {
      frames.clear();
      while (true) {
        zmq::message_t frame;
        if (!socket_.recv(frame, zmq::recv_flags::dontwait)) break;
        const bool more = frame.more();
        frames.push_back(std::move(frame));
        if (!more) break;
      }
      if (frames.empty()) break;
      if (frames.size() < 2) continue;  // no routing id: cannot answer
      const std::string peer = frames[0].to_string();
      const bool req = frames.size() == 3 && frames[1].size() == 0;
      if (req) req_peers_.insert(peer);
      if (frames.size() != 2 && !req) {
        service_->HandleRequest(peer, std::string_view());  // answered with an error
        continue;
      }
      const zmq::message_t& body = frames.back();
      service_->HandleRequest(peer,
                              std::string_view(static_cast<const char*>(body.data()), body.size()));
    }
    service_->Poll();
  }
  service_->CancelAll();
  return Status::OK();
}

}  // namespace orrery::replay
