// Cap'n Proto <-> bytes for the replay store, turning every decoding failure into a Status.
//
// Bytes from the network or disk may be truncated, misaligned or garbage: ReadCapnpMessage copies
// them to an aligned buffer when needed and runs `fn` on the root inside a try block, so a
// kj::Exception thrown by a lazy accessor (a pointer out of bounds, a too-deep structure) becomes
// InvalidArgument instead of escaping a server loop.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/status.h"

namespace orrery::replay {

// The flat (unpacked) encoding of a built message.
std::string CapnpToBytes(capnp::MessageBuilder& builder);

// Calls fn(root) where root is T::Reader; returns fn's Status, or InvalidArgument naming `what`.
template <typename T, typename Fn>
Status ReadCapnpMessage(std::string_view bytes, std::string_view what, Fn&& fn) {
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0) {
    return InvalidArgumentError(std::string(what) + ": not a Cap'n Proto message (" +
                                std::to_string(bytes.size()) + " bytes)");
  }
  kj::Array<capnp::word> copy;
  const capnp::word* words = reinterpret_cast<const capnp::word*>(bytes.data());
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(capnp::word) != 0) {
    copy = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
    std::memcpy(copy.begin(), bytes.data(), bytes.size());
    words = copy.begin();
  }
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = bytes.size() / sizeof(capnp::word) * 4 + 1024;
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(words, bytes.size() / sizeof(capnp::word)), options);
    return fn(reader.getRoot<T>());
  } catch (const kj::Exception& e) {
    return InvalidArgumentError(std::string(what) +
                                ": malformed message: " + std::string(e.getDescription().cStr()));
  }
}

}  // namespace orrery::replay
