// Actor: a mailbox (a ZeroMQ ROUTER socket), a message loop and typed request handlers.
//
//   Actor actor(zmq, "echo:0");
//   ORRERY_RETURN_IF_ERROR(actor.Bind("ipc:///tmp/run/echo-0.sock"));
//   actor.Handle<schema::EchoRequest, schema::EchoReply>(
//       "echo.Echo", [](schema::EchoRequest::Reader req, schema::EchoReply::Builder rep) {
//         rep.setText(req.getText());
//         return Status::OK();
//       });
//   actor.Every(std::chrono::seconds(1), [] { ... });   // timers run on the loop thread
//   return actor.Run(stop);                             // until stop is cancelled
//
// The transport is only the endpoint string: `inproc://name` runs the actor as a thread beside its
// callers (they must share the zmq::context_t), `ipc://path` as a process on the same machine,
// `tcp://host:port` across machines. Handlers run one at a time on the loop thread, so actor state
// needs no locks. A handler returns a Status; a non-OK status travels back to the caller in place
// of the reply. Requests whose deadline has already passed are answered DeadlineExceeded without
// running the handler. Malformed messages, unknown methods and exceptions thrown by a handler are
// answered with an error (and logged); nothing escapes Run().
#pragma once

#include <capnp/message.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "actors/runtime/cancellation.h"
#include "actors/runtime/payload.h"
#include "core/status.h"

namespace orrery {

// What a handler sees besides its request.
struct RequestInfo {
  std::string sender;                  // the caller's name
  int64_t deadline_unix_ms = 0;        // 0: none
  const Cancellation* stop = nullptr;  // the loop's stop token: long handlers should watch it
};

class Actor {
 public:
  using RawHandler = std::function<Status(const Payload& request, const RequestInfo& info,
                                          capnp::MallocMessageBuilder& reply)>;

  Actor(zmq::context_t& zmq, std::string name);
  ~Actor();
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  const std::string& name() const { return name_; }

  // Binds the mailbox (a tcp endpoint as a CURVE server of the fleet's key when this process has
  // one, actors/runtime/fleet_curve.h). Errors name the endpoint: "address in use", ...
  Status Bind(const std::string& endpoint);
  // The bound address (a tcp port 0 resolved to the real port). Empty before Bind.
  const std::string& endpoint() const { return endpoint_; }

  // Registers a typed handler for `method` (replaces an earlier one).
  template <typename Req, typename Rep>
  void Handle(const std::string& method,
              std::function<Status(typename Req::Reader, typename Rep::Builder)> fn) {
    HandleRaw(method,
              [fn](const Payload& request, const RequestInfo&, capnp::MallocMessageBuilder& reply) {
                return fn(request.Root<Req>(), reply.initRoot<Rep>());
              });
  }
  // The same, with the caller's name, deadline and the stop token.
  template <typename Req, typename Rep>
  void HandleWithInfo(
      const std::string& method,
      std::function<Status(typename Req::Reader, const RequestInfo&, typename Rep::Builder)> fn) {
    HandleRaw(method, [fn](const Payload& request, const RequestInfo& info,
                           capnp::MallocMessageBuilder& reply) {
      return fn(request.Root<Req>(), info, reply.initRoot<Rep>());
    });
  }
  void HandleRaw(const std::string& method, RawHandler handler);

  // Runs `fn` on the loop thread every `period` (first run one period after Run starts).
  void Every(std::chrono::milliseconds period, std::function<void()> fn);

  // The message loop: serves requests and timers until `stop` is cancelled, then returns OK.
  // Returns an error only when the mailbox itself fails (not bound, socket closed).
  Status Run(const Cancellation& stop);

  // Requests served since construction (answered with OK).
  uint64_t served() const { return served_; }

 private:
  struct Timer {
    std::chrono::milliseconds period;
    std::chrono::steady_clock::time_point next;
    std::function<void()> fn;
  };
  void ServeOne(const Cancellation& stop);

  std::string name_;
  zmq::context_t& zmq_;
  zmq::socket_t socket_;
  std::string endpoint_;
  std::map<std::string, RawHandler> handlers_;
  std::vector<Timer> timers_;
  uint64_t served_ = 0;
};

}  // namespace orrery
