// The largest message a ZeroMQ socket of this process accepts (ZMQ_MAXMSGSIZE).
//
// Every socket of the fleet (actor mailboxes and clients, the replay store's clients, the env
// server, the metrics hub and publishers) sets it when created, so a peer that sends more is
// disconnected by ZeroMQ before the message is buffered, instead of making a process allocate
// whatever a length prefix claims. `orrery launch` sets it from [fleet].max_message_mb and passes
// it to every actor (`orrery actor --max-message-mb`); the replay store's own socket uses
// [replay].max_message_bytes. Thread-safe.
#pragma once

#include <cstdint>

namespace orrery {

inline constexpr int64_t kDefaultMaxMessageBytes = 1ll << 30;

int64_t MaxMessageBytes();
void SetMaxMessageBytes(int64_t bytes);  // >= 1

}  // namespace orrery
