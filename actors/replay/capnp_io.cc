#include "actors/replay/capnp_io.h"

namespace orrery::replay {

std::string CapnpToBytes(capnp::MessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

}  // namespace orrery::replay
