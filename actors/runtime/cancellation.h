// Cancellation: a one-shot flag that every blocking wait of the actor runtime also watches.
//
// Cancel() is async-signal-safe (an atomic store and a write to an eventfd), so a SIGTERM handler
// may call it. The eventfd becomes readable once cancelled and stays readable, so a message loop
// or a request wait polls it beside its ZeroMQ sockets and wakes at once instead of at the end of
// a timeout.
#pragma once

#include <atomic>
#include <chrono>

namespace orrery {

class Cancellation {
 public:
  Cancellation();
  ~Cancellation();
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Idempotent; async-signal-safe.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Readable (POLLIN) once cancelled.
  int fd() const { return fd_; }
  // Sleeps until cancelled or `timeout` has passed; returns cancelled().
  bool WaitFor(std::chrono::milliseconds timeout) const;

 private:
  std::atomic<bool> cancelled_{false};
  int fd_;
};

}  // namespace orrery
