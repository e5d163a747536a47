// PhaseProfile: where the time of a GPU step goes, by named phase ("fwd.kda.core", "bwd.moe").
//
// Off by default, and then a PhaseScope costs one branch. Started, every scope records a pair of
// CUDA events on the calling lane's ops' stream (device_context.h; a SideStream body's own) — the
// device time between the scope's first and last queued work, which is what a kernel author needs
// and what host timers cannot see in an asynchronous stream. The host time between the scope's ends is recorded beside it: a phase
// whose host time far exceeds its device time is launch- or sync-bound. Scopes nest by name
// ("fwd.kda" around "fwd.kda.core"), so report totals are inclusive. On the CPU (the ops' CPU
// twins) both columns are host time.
//
// Not thread-safe: the thread that drives the device starts, scopes and stops (one rank, one
// thread, as the ops require).
#pragma once

#include <string>
#include <vector>

#include "core/device.h"
#include "core/status.h"

namespace orrery::kernels {

struct PhaseTime {
  std::string name;
  int64_t calls = 0;
  double device_ms = 0;  // sum of event-to-event times (host time on the CPU)
  double host_ms = 0;    // sum of host wall times between the scope's ends
};

class PhaseProfile {
 public:
  // Starts recording scopes for `device` (clears what an earlier Start recorded).
  static Status Start(Device device);
  static bool active();
  // Stops, waits for the recorded events and returns the totals per name, in first-seen order.
  static StatusOr<std::vector<PhaseTime>> Stop();
  // The totals as an aligned table (name, calls, device ms, host ms, % of `total_ms`).
  static std::string Format(const std::vector<PhaseTime>& times, double total_ms);

  // Used by PhaseScope.
  static int Begin(const char* name);
  static void End(int id);
};

// Times the enclosing block as phase `name` while a PhaseProfile is active.
class PhaseScope {
 public:
  explicit PhaseScope(const char* name)
      : id_(PhaseProfile::active() ? PhaseProfile::Begin(name) : -1) {}
  ~PhaseScope() { Stop(); }
  // Ends the phase before the block does (later calls and the destructor do nothing).
  void Stop() {
    if (id_ >= 0) PhaseProfile::End(id_);
    id_ = -1;
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  int id_;
};

}  // namespace orrery::kernels
