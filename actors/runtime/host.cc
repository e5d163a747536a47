#include "actors/runtime/host.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>

#include "actors/runtime/advertise.h"
#include "actors/runtime/client.h"
#include "actors/runtime/coordinator_protocol.h"
#include "actors/runtime/curve_auth.h"
#include "actors/runtime/progress_watchdog.h"
#include "actors/schema/actor.capnp.h"
#include "core/logging.h"

namespace orrery {
namespace {

RunState FromWire(schema::RunState::Reader r) {
  RunState s;
  s.phase = r.getPhase().cStr();
  s.stage = r.getStage();
  s.policy_version = r.getPolicyVersion();
  s.stopping = r.getStopping();
  return s;
}

// No coordinator: the actor serves on its own.
class StandaloneLink : public FleetLink {
 public:
  explicit StandaloneLink(std::atomic<uint64_t>& progress) : progress_(progress) {}
  void SetReady() override {}
  void Progress() override { progress_.fetch_add(1, std::memory_order_relaxed); }
  RunState run_state() const override { return RunState{}; }
  StatusOr<std::string> Lookup(const std::string& name, std::chrono::milliseconds) override {
    return NotFoundError("cannot look up '" + name + "': this actor runs without a coordinator");
  }
  Status SetRunState(const std::string&, int64_t, int64_t) override {
    return FailedPreconditionError("no coordinator to hold the run state");
  }

 private:
  std::atomic<uint64_t>& progress_;
};

// Registers with the coordinator and heartbeats from its own thread (ZeroMQ sockets belong to one
// thread, so lookups use a socket of their own).
class CoordinatorLink : public FleetLink {
 public:
  CoordinatorLink(zmq::context_t& zmq, const ActorHostOptions& options, std::string name,
                  Cancellation& actor_stop, std::atomic<uint64_t>& progress)
      : zmq_(zmq),
        options_(options),
        name_(std::move(name)),
        actor_stop_(actor_stop),
        progress_(progress) {}

  ~CoordinatorLink() override { StopHeartbeats(); }

  void StartHeartbeats() {
    thread_ = std::thread([this] {
      ScopedLogPrefix prefix(name_);
      Loop();
    });
  }

  void StopHeartbeats() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void SetReady() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_ = true;
      beat_now_ = true;
    }
    cv_.notify_all();
  }

  void Progress() override { progress_.fetch_add(1, std::memory_order_relaxed); }

  RunState run_state() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return run_state_;
  }

  StatusOr<std::string> Lookup(const std::string& name, std::chrono::milliseconds wait) override {
    ActorClient client(zmq_, name_);
    ORRERY_RETURN_IF_ERROR(client.Connect(options_.coordinator));
    const auto end = std::chrono::steady_clock::now() + wait;
    Status last;
    while (true) {
      auto reply = client.Call<schema::LookupRequest, schema::LookupReply>(
          coordinator_methods::kLookup,
          [&](schema::LookupRequest::Builder req) { req.setName(name); },
          CallOptions{std::chrono::milliseconds(1000), &actor_stop_});
      if (reply.ok()) return std::string(reply->get().getEndpoint().cStr());
      last = reply.status();
      if (last.code() == StatusCode::kCancelled) return last;
      if (std::chrono::steady_clock::now() >= end) break;
      if (actor_stop_.WaitFor(std::chrono::milliseconds(100)))
        return CancelledError("lookup of " + name);
    }
    return last;
  }

  Status SetRunState(const std::string& phase, int64_t stage, int64_t policy_version) override {
    ActorClient client(zmq_, name_);
    ORRERY_RETURN_IF_ERROR(client.Connect(options_.coordinator));
    auto reply = client.Call<schema::SetRunStateRequest, schema::RunState>(
        coordinator_methods::kSetRunState,
        [&](schema::SetRunStateRequest::Builder req) {
          req.setPhase(phase);
          req.setStage(stage);
          req.setPolicyVersion(policy_version);
        },
        CallOptions{std::chrono::milliseconds(2000), &actor_stop_});
    if (!reply.ok()) return reply.status();
    std::lock_guard<std::mutex> lock(mu_);
    run_state_ = FromWire(reply->get());
    return Status::OK();
  }

 private:
  void Loop() {
    ActorClient client(zmq_, name_);
    if (Status s = client.Connect(options_.coordinator); !s.ok()) {
      ORRERY_LOG(ERROR) << s.message();
      return;
    }
    bool registered = false;
    bool warned = false;
    while (true) {
      bool ready;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (done_) return;
        ready = ready_;
        beat_now_ = false;
      }
      const CallOptions call{std::max(options_.heartbeat * 2, std::chrono::milliseconds(200)),
                             &actor_stop_};
      StatusOr<Reply<schema::HeartbeatReply>> reply = Status(StatusCode::kInternal, "unset");
      if (!registered) {
        reply = client.Call<schema::RegisterRequest, schema::HeartbeatReply>(
            coordinator_methods::kRegister,
            [&](schema::RegisterRequest::Builder req) {
              req.setName(name_);
              req.setRole(options_.role);
              req.setIndex(static_cast<uint32_t>(options_.index));
              req.setEndpoint(AdvertisedEndpoint(options_.endpoint));
              req.setPid(getpid());
              req.setHost(LocalHostName());
              req.setReady(ready);
              req.setProgress(progress_.load(std::memory_order_relaxed));
              req.setAuthRefused(CurveRefusedTotal());
            },
            call);
      } else {
        reply = client.Call<schema::HeartbeatRequest, schema::HeartbeatReply>(
            coordinator_methods::kHeartbeat,
            [&](schema::HeartbeatRequest::Builder req) {
              req.setName(name_);
              req.setPid(getpid());
              req.setReady(ready);
              req.setProgress(progress_.load(std::memory_order_relaxed));
              req.setAuthRefused(CurveRefusedTotal());
            },
            call);
      }
      if (reply.ok()) {
        const bool known = reply->get().getKnown();
        RunState state = FromWire(reply->get().getRunState());
        if (!registered && known) ORRERY_LOG(DEBUG) << "registered with " << options_.coordinator;
        registered = known;  // unknown: the coordinator restarted; register again
        warned = false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          run_state_ = state;
        }
        if (state.stopping && !actor_stop_.cancelled()) {
          ORRERY_LOG(INFO) << "the fleet is stopping";
          actor_stop_.Cancel();
        }
      } else if (reply.status().code() != StatusCode::kCancelled && !warned) {
        ORRERY_LOG(WARN) << "coordinator unreachable: " << reply.status().message();
        warned = true;  // once per outage
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, options_.heartbeat, [this] { return done_ || beat_now_; });
    }
  }

  zmq::context_t& zmq_;
  ActorHostOptions options_;
  std::string name_;
  Cancellation& actor_stop_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool ready_ = false;
  bool beat_now_ = false;
  RunState run_state_;
  std::atomic<uint64_t>& progress_;
};

}  // namespace

Status RunActor(zmq::context_t& zmq, const ActorHostOptions& options, Cancellation& stop) {
  const ActorRole* role = FindActorRole(options.role);
  if (role == nullptr) {
    std::string known;
    for (const std::string& n : ActorRoleNames()) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgumentError("unknown actor role '" + options.role + "' (known: " + known + ")");
  }
  if (options.endpoint.empty()) {
    return InvalidArgumentError("actor " + options.role + ": no endpoint given");
  }
  const std::string name = options.role + ":" + std::to_string(options.index);
  ScopedLogPrefix prefix(name);

  std::optional<ConfigDocument> config;
  if (!options.config_path.empty()) {
    StatusOr<ConfigDocument> doc =
        ConfigDocument::ParseFile(options.config_path, options.config_dir);
    if (!doc.ok()) return doc.status();
    config.emplace(std::move(doc).value());
  }
  ActorContext::Fields fields;
  fields.role = options.role;
  fields.index = options.index;
  fields.endpoint = options.endpoint;
  fields.config_path = options.config_path;
  fields.run_dir = options.run_dir;
  fields.state_dir = (std::filesystem::path(options.run_dir) / "actors" /
                      (options.role + "-" + std::to_string(options.index)))
                         .string();
  std::error_code ec;
  std::filesystem::create_directories(fields.state_dir, ec);
  if (ec) return IoError("cannot create " + fields.state_dir + ": " + ec.message());

  std::atomic<uint64_t> progress{0};  // ActorContext::Progress; heartbeats carry it
  std::unique_ptr<FleetLink> link;
  CoordinatorLink* coordinator_link = nullptr;
  if (!options.coordinator.empty()) {
    auto l = std::make_unique<CoordinatorLink>(zmq, options, name, stop, progress);
    coordinator_link = l.get();
    link = std::move(l);
  } else {
    link = std::make_unique<StandaloneLink>(progress);
  }
  std::optional<ProgressWatchdog> watchdog;
  if (options.progress_timeout.count() > 0) {
    watchdog.emplace(progress, options.progress_timeout, name);
  }
  ActorContext context(fields, zmq, stop, *link, config ? &*config : nullptr);
  if (coordinator_link != nullptr) coordinator_link->StartHeartbeats();
  ORRERY_LOG(INFO) << "started (pid " << getpid() << ", endpoint " << options.endpoint << ")";
  Status status = CatchAll("actor " + name, [&] { return role->main(context); });
  watchdog.reset();  // the main loop is over: what follows is not its progress
  if (coordinator_link != nullptr) coordinator_link->StopHeartbeats();
  if (status.ok()) {
    ORRERY_LOG(INFO) << "stopped";
  } else {
    ORRERY_LOG(ERROR) << "failed: " << status.message();
  }
  return status;
}

std::unique_ptr<ActorThread> ActorThread::Start(zmq::context_t& zmq, ActorHostOptions options) {
  std::unique_ptr<ActorThread> t(new ActorThread());
  ActorThread* self = t.get();
  t->thread_ = std::thread([self, &zmq, options = std::move(options)] {
    self->result_ = RunActor(zmq, options, self->stop_);
    self->finished_ = true;
  });
  return t;
}

ActorThread::~ActorThread() { (void)Stop(); }

Status ActorThread::Stop() {
  stop_.Cancel();
  if (thread_.joinable()) thread_.join();
  return result_;
}

}  // namespace orrery
