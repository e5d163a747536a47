// Payload: one received Cap'n Proto message body, owned and word-aligned.
//
// ZeroMQ frames carry no alignment guarantee, and Cap'n Proto readers need 8-byte alignment, so
// a Payload copies the frame into words once. Root<T>() gives the typed reader; Cap'n Proto
// validates lazily and throws kj::Exception on malformed data, which the actor loop and the client
// turn into Status values (no exception leaves the runtime).
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include <cstddef>
#include <memory>
#include <string>

#include "core/status.h"

namespace orrery {

class Payload {
 public:
  Payload() = default;
  // Fails with InvalidArgument when `size` is not a whole number of words or the segment table
  // is malformed.
  static StatusOr<Payload> FromBytes(const void* data, size_t size);

  template <typename T>
  typename T::Reader Root() const {
    return reader_->getRoot<T>();
  }
  bool empty() const { return reader_ == nullptr; }

 private:
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

// The flat bytes of a built message (what goes into a frame).
kj::Array<capnp::word> MessageWords(capnp::MessageBuilder& message);

// Runs `fn` and turns a kj::Exception or std::exception it throws into a Status naming `what`.
template <typename Fn>
Status CatchAll(const std::string& what, Fn&& fn);

namespace internal {
Status StatusFromKjException(const std::string& what, const char* description);
}

}  // namespace orrery

#include <kj/exception.h>

#include <exception>

namespace orrery {

template <typename Fn>
Status CatchAll(const std::string& what, Fn&& fn) {
  try {
    return fn();
  } catch (const kj::Exception& e) {
    return internal::StatusFromKjException(what, e.getDescription().cStr());
  } catch (const std::exception& e) {
    return InternalError(what + ": " + e.what());
  } catch (...) {
    return InternalError(what + ": unknown exception");
  }
}

}  // namespace orrery
