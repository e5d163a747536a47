#include "actors/runtime/cancellation.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "core/logging.h"

namespace orrery {

Cancellation::Cancellation() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  // Without the fd no wait could be woken: this is a resource failure of the whole process.
  if (fd_ < 0) ORRERY_LOG(FATAL) << "eventfd failed: errno " << errno;
}

Cancellation::~Cancellation() { close(fd_); }

void Cancellation::Cancel() {
  if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
  const uint64_t one = 1;
  // Never read back: the counter stays non-zero, the fd stays readable.
  [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof(one));
}

bool Cancellation::WaitFor(std::chrono::milliseconds timeout) const {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!cancelled()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, static_cast<int>(left.count()));
  }
  return cancelled();
}

}  // namespace orrery
