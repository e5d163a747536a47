// ActorClient: calls methods of one actor and waits for the reply, with a deadline and an
// optional cancellation.
//
//   ActorClient client(zmq, "rollout:3");
//   ORRERY_RETURN_IF_ERROR(client.Connect(endpoint));
//   ORRERY_ASSIGN_OR_RETURN(auto reply, (client.Call<schema::EchoRequest, schema::EchoReply>(
//       "echo.Echo", [](schema::EchoRequest::Builder req) { req.setText("hi"); },
//       {.timeout = std::chrono::seconds(2), .cancel = &stop})));
//   std::string text = reply.get().getText().cStr();
//
// The deadline travels with the request (a server skips requests whose caller gave up). A call
// ends with the reply, DeadlineExceeded when the timeout passes, Cancelled when `cancel` fires, or
// the error status the handler returned. Replies to earlier, abandoned requests are discarded.
// ZeroMQ reconnects by itself: when the peer restarts at the same endpoint, the next call reaches
// the new incarnation (retry after DeadlineExceeded/Unavailable). A client is a DEALER socket:
// use it from one thread at a time.
#pragma once

#include <capnp/message.h>

#include <chrono>
#include <functional>
#include <string>
#include <zmq.hpp>

#include "actors/runtime/cancellation.h"
#include "actors/runtime/payload.h"
#include "core/status.h"

namespace orrery {

struct CallOptions {
  std::chrono::milliseconds timeout{5000};
  const Cancellation* cancel = nullptr;  // optional
};

// A typed reply; owns its message.
template <typename Rep>
class Reply {
 public:
  explicit Reply(Payload payload) : payload_(std::move(payload)) {}
  typename Rep::Reader get() const { return payload_.Root<Rep>(); }

 private:
  Payload payload_;
};

class ActorClient {
 public:
  ActorClient(zmq::context_t& zmq, std::string self_name);
  ~ActorClient();
  ActorClient(const ActorClient&) = delete;
  ActorClient& operator=(const ActorClient&) = delete;

  // Connects to `endpoint`, dropping any earlier connection and pending replies. Connecting
  // succeeds before the peer exists (ZeroMQ connects in the background).
  Status Connect(const std::string& endpoint);
  const std::string& endpoint() const { return endpoint_; }

  // Sends `request` as `method` and waits for the reply body.
  StatusOr<Payload> CallRaw(const std::string& method, capnp::MessageBuilder& request,
                            const CallOptions& options);

  template <typename Req, typename Rep>
  StatusOr<Reply<Rep>> Call(const std::string& method,
                            const std::function<void(typename Req::Builder)>& fill,
                            const CallOptions& options = {}) {
    capnp::MallocMessageBuilder request;
    Status built = CatchAll(method, [&] {
      fill(request.initRoot<Req>());
      return Status::OK();
    });
    if (!built.ok()) return built;
    StatusOr<Payload> body = CallRaw(method, request, options);
    if (!body.ok()) return body.status();
    Reply<Rep> reply(std::move(body).value());
    // Touch the root once so a malformed reply fails here, not in the caller's field access.
    Status valid = CatchAll(method + " reply", [&] {
      reply.get();
      return Status::OK();
    });
    if (!valid.ok()) return valid;
    return reply;
  }

 private:
  zmq::context_t& zmq_;
  std::string name_;
  std::string endpoint_;
  std::unique_ptr<zmq::socket_t> socket_;
  uint64_t next_request_id_;
};

}  // namespace orrery
