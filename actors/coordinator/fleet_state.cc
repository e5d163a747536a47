#include "actors/coordinator/fleet_state.h"

#include <limits>

#include "actors/runtime/wire.h"

namespace orrery {
namespace {

void RecordProgress(ActorRecord& r, uint64_t progress) {
  if (progress == r.progress) return;
  r.progress = progress;
  r.last_progress_ms = UnixMillis();
}

// `count`: the incarnation's running total (it only grows within one process).
void RecordAuthRefused(ActorRecord& r, uint64_t count) {
  if (count <= r.auth_refused_incarnation) return;
  r.auth_refused += count - r.auth_refused_incarnation;
  r.auth_refused_incarnation = count;
}

}  // namespace

const char* ActorStateName(ActorState state) {
  switch (state) {
    case ActorState::kStarting:
      return "starting";
    case ActorState::kRunning:
      return "running";
    case ActorState::kBackoff:
      return "backoff";
    case ActorState::kExited:
      return "exited";
    case ActorState::kFailed:
      return "failed";
    case ActorState::kStopped:
      return "stopped";
  }
  return "unknown";
}

void FleetState::Expect(const ActorRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ms_ == 0) started_ms_ = UnixMillis();
  actors_[record.name] = record;
}

void FleetState::Register(const std::string& name, const std::string& role, int index,
                          const std::string& endpoint, const std::string& host, int64_t pid,
                          bool ready, uint64_t progress, uint64_t auth_refused) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ms_ == 0) started_ms_ = UnixMillis();
  ActorRecord& r = actors_[name];
  r.name = name;
  r.role = role;
  r.index = index;
  r.endpoint = endpoint;
  r.host = host;
  if (r.pid != pid) {  // a new incarnation: its counters start over
    r.progress = 0;
    r.last_progress_ms = 0;
    r.auth_refused_incarnation = 0;
  }
  r.pid = pid;
  r.last_heartbeat_ms = UnixMillis();
  RecordProgress(r, progress);
  RecordAuthRefused(r, auth_refused);
  if (r.state == ActorState::kStarting || r.state == ActorState::kRunning ||
      r.state == ActorState::kBackoff || !r.supervised) {
    r.state = ready ? ActorState::kRunning : ActorState::kStarting;
  }
}

bool FleetState::Heartbeat(const std::string& name, int64_t pid, bool ready, uint64_t progress,
                           uint64_t auth_refused) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(name);
  if (it == actors_.end() || it->second.pid != pid) return false;
  ActorRecord& r = it->second;
  r.last_heartbeat_ms = UnixMillis();
  RecordProgress(r, progress);
  RecordAuthRefused(r, auth_refused);
  if (r.state == ActorState::kStarting && ready) r.state = ActorState::kRunning;
  return true;
}

StatusOr<std::pair<std::string, std::string>> FleetState::Lookup(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(key);
  if (it != actors_.end()) {
    if (it->second.state != ActorState::kRunning) {
      return UnavailableError("actor " + key + " is " + ActorStateName(it->second.state));
    }
    return std::make_pair(it->second.name, it->second.endpoint);
  }
  const ActorRecord* best = nullptr;
  uint64_t best_count = std::numeric_limits<uint64_t>::max();
  bool any = false;
  for (const auto& [name, r] : actors_) {
    if (r.role != key) continue;
    any = true;
    if (r.state != ActorState::kRunning) continue;
    if (lookups_[name] < best_count) {
      best = &r;
      best_count = lookups_[name];
    }
  }
  if (best == nullptr) {
    if (any) return UnavailableError("no instance of role '" + key + "' is running yet");
    return NotFoundError("no actor or role named '" + key + "' in this fleet");
  }
  ++lookups_[best->name];
  return std::make_pair(best->name, best->endpoint);
}

void FleetState::MarkSpawned(const std::string& name, int64_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  ActorRecord& r = actors_[name];
  r.pid = pid;
  r.state = ActorState::kStarting;
  r.last_heartbeat_ms = 0;
  r.progress = 0;
  r.last_progress_ms = 0;
  r.auth_refused_incarnation = 0;
}

void FleetState::MarkDown(const std::string& name, ActorState state, const std::string& how,
                          bool count_restart) {
  std::lock_guard<std::mutex> lock(mu_);
  ActorRecord& r = actors_[name];
  r.state = state;
  r.last_exit = how;
  if (count_restart) ++r.restarts;
}

std::optional<ActorRecord> FleetState::Get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(name);
  if (it == actors_.end()) return std::nullopt;
  return it->second;
}

RunState FleetState::run_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_state_;
}

RunState FleetState::SetRunState(const std::string& phase, int64_t stage, int64_t policy_version) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!phase.empty()) run_state_.phase = phase;
  if (stage >= 0) run_state_.stage = static_cast<uint32_t>(stage);
  if (policy_version >= 0) run_state_.policy_version = static_cast<uint64_t>(policy_version);
  return run_state_;
}

void FleetState::SetStopping() {
  std::lock_guard<std::mutex> lock(mu_);
  run_state_.stopping = true;
  run_state_.phase = "stopping";
}

std::vector<ActorRecord> FleetState::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ActorRecord> out;
  for (const auto& [name, r] : actors_) out.push_back(r);
  return out;
}

int DashboardStateCode(ActorState state) {
  switch (state) {
    case ActorState::kStarting:
      return 0;
    case ActorState::kRunning:
      return 1;
    case ActorState::kBackoff:
      return 2;
    case ActorState::kExited:
    case ActorState::kStopped:
      return 3;
    case ActorState::kFailed:
      return 4;
  }
  return 4;
}

std::vector<MetricRecord> FleetState::ToMetrics(int64_t step,
                                                uint64_t coordinator_auth_refused) const {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = UnixSeconds();
  const int64_t now_ms = UnixMillis();
  std::vector<MetricRecord> out;
  MetricRecord fleet;
  fleet.time = now;
  fleet.source = "coordinator";
  fleet.step = step;
  std::map<std::string, double> by_state;
  for (ActorState s : {ActorState::kStarting, ActorState::kRunning, ActorState::kBackoff,
                       ActorState::kExited, ActorState::kFailed, ActorState::kStopped}) {
    by_state[std::string("fleet/actors_") + ActorStateName(s)] = 0;
  }
  double auth_refused = static_cast<double>(coordinator_auth_refused);
  for (const auto& [name, r] : actors_) {
    MetricRecord m;
    m.time = now;
    m.source = name;
    m.step = step;
    m.scalars["fleet/state"] = DashboardStateCode(r.state);
    m.scalars["fleet/restarts_total"] = r.restarts;
    m.scalars["fleet/heartbeat_age_seconds"] =
        r.last_heartbeat_ms == 0 ? -1 : (now_ms - r.last_heartbeat_ms) / 1000.0;
    m.scalars["fleet/progress_age_seconds"] =
        r.last_progress_ms == 0 ? -1 : (now_ms - r.last_progress_ms) / 1000.0;
    m.scalars["fleet/pid"] = static_cast<double>(r.pid);
    m.scalars["fleet/auth_refused"] = static_cast<double>(r.auth_refused);
    out.push_back(std::move(m));
    by_state[std::string("fleet/actors_") + ActorStateName(r.state)] += 1;
    auth_refused += static_cast<double>(r.auth_refused);
  }
  fleet.scalars = by_state;
  fleet.scalars["fleet/auth_refused_total"] = auth_refused;
  fleet.scalars["fleet/stage"] = run_state_.stage;
  fleet.scalars["fleet/policy_version"] = static_cast<double>(run_state_.policy_version);
  out.push_back(std::move(fleet));
  return out;
}

}  // namespace orrery
