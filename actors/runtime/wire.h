// The two-frame message format shared by Actor (server side) and ActorClient (caller side):
// an Envelope frame (actors/schema/actor.capnp) and a body frame. A ROUTER mailbox sees one more
// frame in front, the caller's ZeroMQ identity.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "actors/runtime/payload.h"
#include "core/status.h"

namespace orrery {

struct Envelope {
  std::string method;
  uint64_t request_id = 0;
  int64_t deadline_unix_ms = 0;  // 0: none
  std::string sender;
  bool is_reply = false;
  Status status;  // replies only
};

struct WireMessage {
  std::string identity;  // ROUTER side only
  Envelope envelope;
  Payload body;  // empty for error replies
};

// Sends [identity?][envelope][body]; body may be null (an empty frame: error replies).
// Returns Unavailable when the socket would block (peer queue full) or is closed.
Status SendWireMessage(zmq::socket_t& socket, const std::string* identity, const Envelope& envelope,
                       capnp::MessageBuilder* body);

// Receives one message without blocking (call after poll says readable); Unavailable when none is
// waiting. A malformed message is consumed whole (so the next one can be read) and gives
// InvalidArgument, with `*message` holding what was read before the fault: the sender's identity
// (ROUTER side), then the envelope. So a server can still address an error reply to the sender,
// with the request id when the envelope was sound.
Status ReceiveWireMessage(zmq::socket_t& socket, bool with_identity, WireMessage* message);
// The same for callers that drop malformed messages.
StatusOr<WireMessage> ReceiveWireMessage(zmq::socket_t& socket, bool with_identity);

int64_t UnixMillis();

}  // namespace orrery
