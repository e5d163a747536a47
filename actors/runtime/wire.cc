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

Status ReceiveWireMessage(zmq::socket_t& socket, bool with_identity, WireMessage* message) {
  *message = WireMessage();
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
  size_t i = 0;
  if (with_identity) message->identity = frames[i++].to_string();
  if (frames.size() - i != 2) {
    return InvalidArgumentError("message with " + std::to_string(frames.size() - i) +
                                " frames, expected 2 (envelope, body)");
  }
  StatusOr<Payload> header = Payload::FromBytes(frames[i].data(), frames[i].size());
  if (!header.ok()) return header.status().WithContext("envelope");
  ++i;
  Envelope& env = message->envelope;
  ORRERY_RETURN_IF_ERROR(CatchAll("envelope", [&] {
    auto h = header->Root<schema::Envelope>();
    env.method = h.getMethod().cStr();
    env.request_id = h.getRequestId();
    env.deadline_unix_ms = h.getDeadlineUnixMs();
    env.sender = h.getSender().cStr();
    env.is_reply = h.getIsReply();
    const uint16_t code = h.getStatusCode();
    if (code != 0) {
      if (code > static_cast<uint16_t>(StatusCode::kInternal)) {
        env.status = InternalError("unknown status code " + std::to_string(code) + ": " +
                                   std::string(h.getStatusMessage().cStr()));
      } else {
        env.status = Status(static_cast<StatusCode>(code), h.getStatusMessage().cStr());
      }
    }
    return Status::OK();
  }));
  if (frames[i].size() != 0) {
    StatusOr<Payload> body = Payload::FromBytes(frames[i].data(), frames[i].size());
    if (!body.ok()) return body.status().WithContext(env.method + " body");
    message->body = std::move(body).value();
  }
  return Status::OK();
}

StatusOr<WireMessage> ReceiveWireMessage(zmq::socket_t& socket, bool with_identity) {
  WireMessage m;
  ORRERY_RETURN_IF_ERROR(ReceiveWireMessage(socket, with_identity, &m));
  return m;
}

}  // namespace orrery
