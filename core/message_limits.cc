#include "core/message_limits.h"

#include <atomic>

namespace orrery {
namespace {

std::atomic<int64_t> max_message_bytes{kDefaultMaxMessageBytes};

}  // namespace

int64_t MaxMessageBytes() { return max_message_bytes.load(std::memory_order_relaxed); }

void SetMaxMessageBytes(int64_t bytes) {
  max_message_bytes.store(bytes, std::memory_order_relaxed);
}

}  // namespace orrery
