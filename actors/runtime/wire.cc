#include "actors/runtime/wire.h"

#include <capnp/serialize.h>

#include <chrono>
#include <vector>

#include "actors/schema/actor.capnp.h"

namespace orrery {

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status SendWireMessage(zmq::socket_t& socket, const std::string* identity, const Envelope& envelope,
                       capnp::MessageBuilder* body) {
  capnp::MallocMessageBuilder header;
  auto h = header.initRoot<schema::Envelope>();
  h.setMethod(envelope.method);
  h.setRequestId(envelope.request_id);
  h.setDeadlineUnixMs(envelope.deadline_unix_ms);
  h.setSender(envelope.sender);
  h.setIsReply(envelope.is_reply);
  h.setStatusCode(static_cast<uint16_t>(envelope.status.code()));
  h.setStatusMessage(envelope.status.message());
  kj::Array<capnp::word> header_words = capnp::messageToFlatArray(header);
  kj::Array<capnp::word> body_words;
  if (body != nullptr) body_words = capnp::messageToFlatArray(*body);
  try {
    if (identity != nullptr) {
      if (!socket.send(zmq::buffer(*identity),
                       zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        return UnavailableError("send queue full");
    }
    auto hb = header_words.asBytes();
    if (!socket.send(zmq::buffer(hb.begin(), hb.size()),
                     zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return UnavailableError("send queue full");
    auto bb = body_words.asBytes();
    if (!socket.send(zmq::buffer(bb.begin(), bb.size()), zmq::send_flags::dontwait))
      return UnavailableError("send queue full");
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("send failed: ") + e.what());
  }
  return Status::OK();
}

StatusOr<WireMessage> ReceiveWireMessage(zmq::socket_t& socket, bool with_identity) {
  std::vector<zmq::message_t> frames;
  try {
    while (true) {
      zmq::message_t frame;
      if (!socket.recv(frame, zmq::recv_flags::dontwait)) {
        if (frames.empty()) return UnavailableError("no message");
        break;
      }
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("receive failed: ") + e.what());
  }
  const size_t expected = with_identity ? 3 : 2;
  if (frames.size() != expected) {
    return InvalidArgumentError("message with " + std::to_string(frames.size()) +
                                " frames, expected " + std::to_string(expected));
  }
  WireMessage m;
  size_t i = 0;
  if (with_identity) m.identity = frames[i++].to_string();
  ORRERY_ASSIGN_OR_RETURN(Payload header, Payload::FromBytes(frames[i].data(), frames[i].size()));
  ++i;
  Status s = CatchAll("envelope", [&] {
    auto h = header.Root<schema::Envelope>();
    m.envelope.method = h.getMethod().cStr();
    m.envelope.request_id = h.getRequestId();
    m.envelope.deadline_unix_ms = h.getDeadlineUnixMs();
    m.envelope.sender = h.getSender().cStr();
    m.envelope.is_reply = h.getIsReply();
    const uint16_t code = h.getStatusCode();
    if (code != 0) {
      if (code > static_cast<uint16_t>(StatusCode::kInternal)) {
        m.envelope.status = InternalError("unknown status code " + std::to_string(code) + ": " +
                                          std::string(h.getStatusMessage().cStr()));
      } else {
        m.envelope.status = Status(static_cast<StatusCode>(code), h.getStatusMessage().cStr());
      }
    }
    return Status::OK();
  });
  ORRERY_RETURN_IF_ERROR(s);
  if (frames[i].size() != 0) {
    ORRERY_ASSIGN_OR_RETURN(m.body, Payload::FromBytes(frames[i].data(), frames[i].size()));
  }
  return m;
}

}  // namespace orrery
