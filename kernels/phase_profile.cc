#include "kernels/phase_profile.h"

#include <chrono>
#include <cstdio>
#include <unordered_map>
#include <utility>

#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/device_context.h"
#endif

namespace orrery::kernels {
namespace {

using Clock = std::chrono::steady_clock;

struct Record {
  int name = 0;  // index into State::names
  Clock::time_point host_begin, host_end;
#if defined(ORRERY_KERNELS_CUDA)
  cudaEvent_t begin = nullptr, end = nullptr;
  cudaStream_t stream = nullptr;  // the ops' stream where the scope began (a side stream's own)
#endif
};

struct State {
  bool active = false;
  Device device;
  std::vector<std::string> names;
  std::unordered_map<std::string, int> index;
  std::vector<Record> records;
#if defined(ORRERY_KERNELS_CUDA)
  std::vector<cudaEvent_t> free_events;  // kept across Start/Stop: creating events is not free

  cudaEvent_t TakeEvent() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    return e;
  }
#endif
};

State& S() {
  static State* s = new State();  // never destroyed: scopes may outlive static destruction order
  return *s;
}

}  // namespace

Status PhaseProfile::Start(Device device) {
  State& s = S();
  s.active = true;
  s.device = device;
  s.names.clear();
  s.index.clear();
  s.records.clear();
#if defined(ORRERY_KERNELS_CUDA)
  if (device.is_cuda()) {
    ORRERY_RETURN_IF_ERROR(cuda::DeviceContext::Get(device.index).status());
  }
#else
  if (device.is_cuda()) {
    s.active = false;
    return FailedPreconditionError("phase profile: this build has no CUDA support");
  }
#endif
  return Status::OK();
}

bool PhaseProfile::active() { return S().active; }

int PhaseProfile::Begin(const char* name) {
  State& s = S();
  auto [it, added] = s.index.emplace(name, static_cast<int>(s.names.size()));
  if (added) s.names.push_back(name);
  Record r;
  r.name = it->second;
#if defined(ORRERY_KERNELS_CUDA)
  if (s.device.is_cuda()) {
    // The context of the calling lane: inside a SideStream body (core/cuda_side_stream.h) the
    // scope times that stream's work.
    auto ctx = cuda::DeviceContext::Get(s.device.index);
    if (ctx.ok()) {
      r.stream = (*ctx)->stream();
      r.begin = s.TakeEvent();
      r.end = s.TakeEvent();
      if (r.begin != nullptr) cudaEventRecord(r.begin, r.stream);
    }
  }
#endif
  r.host_begin = Clock::now();
  s.records.push_back(r);
  return static_cast<int>(s.records.size()) - 1;
}

void PhaseProfile::End(int id) {
  State& s = S();
  if (!s.active || id >= static_cast<int>(s.records.size())) return;  // stopped inside the scope
  Record& r = s.records[id];
#if defined(ORRERY_KERNELS_CUDA)
  if (r.end != nullptr) cudaEventRecord(r.end, r.stream);
#endif
  r.host_end = Clock::now();
}

StatusOr<std::vector<PhaseTime>> PhaseProfile::Stop() {
  State& s = S();
  s.active = false;
  std::vector<PhaseTime> out(s.names.size());
  for (size_t i = 0; i < s.names.size(); ++i) out[i].name = s.names[i];
  Status status;
#if defined(ORRERY_KERNELS_CUDA)
  if (s.device.is_cuda()) {
    for (const Record& r : s.records) {
      if (!status.ok()) break;
      if (r.end != nullptr) status = cuda::CudaStatus(cudaEventSynchronize(r.end), "profile");
    }
  }
#endif
  for (Record& r : s.records) {
    PhaseTime& t = out[r.name];
    ++t.calls;
    const double host =
        std::chrono::duration<double, std::milli>(r.host_end - r.host_begin).count();
    t.host_ms += host;
#if defined(ORRERY_KERNELS_CUDA)
    if (s.device.is_cuda()) {
      float ms = 0;
      if (status.ok() && r.begin != nullptr && r.end != nullptr) {
        status = cuda::CudaStatus(cudaEventElapsedTime(&ms, r.begin, r.end), "profile events");
      }
      t.device_ms += ms;
      if (r.begin != nullptr) s.free_events.push_back(r.begin);
      if (r.end != nullptr) s.free_events.push_back(r.end);
      continue;
    }
#endif
    t.device_ms += host;
  }
  s.records.clear();
  if (!status.ok()) return status;
  return out;
}

std::string PhaseProfile::Format(const std::vector<PhaseTime>& times, double total_ms) {
  size_t width = 5;
  for (const PhaseTime& t : times) width = std::max(width, t.name.size());
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-*s %7s %11s %11s %7s\n", static_cast<int>(width), "phase",
                "calls", "device ms", "host ms", "device%");
  out += line;
  for (const PhaseTime& t : times) {
    std::snprintf(line, sizeof line, "%-*s %7lld %11.2f %11.2f %6.1f%%\n", static_cast<int>(width),
                  t.name.c_str(), static_cast<long long>(t.calls), t.device_ms, t.host_ms,
                  total_ms > 0 ? 100.0 * t.device_ms / total_ms : 0.0);
    out += line;
  }
  return out;
}

}  // namespace orrery::kernels
