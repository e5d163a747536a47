#include "actors/runtime/payload.h"

#include <cstring>

namespace orrery {

StatusOr<Payload> Payload::FromBytes(const void* data, size_t size) {
  if (size % sizeof(capnp::word) != 0 || size == 0) {
    return InvalidArgumentError("message body of " + std::to_string(size) +
                                " bytes is not a whole number of 8-byte words");
  }
  Payload p;
  p.words_ = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(p.words_.begin(), data, size);
  Status s = CatchAll("message body", [&] {
    p.reader_ = std::make_unique<capnp::FlatArrayMessageReader>(p.words_.asPtr());
    return Status::OK();
  });
  if (!s.ok()) return s;
  return p;
}

kj::Array<capnp::word> MessageWords(capnp::MessageBuilder& message) {
  return capnp::messageToFlatArray(message);
}

namespace internal {
Status StatusFromKjException(const std::string& what, const char* description) {
  return InvalidArgumentError(what + ": malformed Cap'n Proto message: " + description);
}
}  // namespace internal

}  // namespace orrery
