#include "actors/coordinator/coordinator.h"

#include "actors/runtime/coordinator_protocol.h"
#include "actors/schema/actor.capnp.h"
#include "core/logging.h"

namespace orrery {
namespace {

void ToWire(const RunState& s, schema::RunState::Builder out) {
  out.setPhase(s.phase);
  out.setStage(s.stage);
  out.setPolicyVersion(s.policy_version);
  out.setStopping(s.stopping);
}

}  // namespace

StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(zmq::context_t& zmq,
                                                                      const std::string& endpoint,
                                                                      FleetState& state) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->actor_ = std::make_unique<Actor>(zmq, "coordinator");
  Actor& actor = *server->actor_;
  ORRERY_RETURN_IF_ERROR(actor.Bind(endpoint));
  FleetState* fleet = &state;
  namespace m = coordinator_methods;

  actor.Handle<schema::RegisterRequest, schema::HeartbeatReply>(
      m::kRegister,
      [fleet](schema::RegisterRequest::Reader req, schema::HeartbeatReply::Builder rep) {
        const std::string name = req.getName().cStr();
        if (name.empty()) return InvalidArgumentError("register without a name");
        fleet->Register(name, req.getRole().cStr(), static_cast<int>(req.getIndex()),
                        req.getEndpoint().cStr(), req.getHost().cStr(), req.getPid(),
                        req.getReady(), req.getProgress(), req.getAuthRefused());
        ORRERY_LOG(INFO) << name << " registered (pid " << req.getPid() << ", "
                         << req.getEndpoint().cStr() << ")";
        rep.setKnown(true);
        ToWire(fleet->run_state(), rep.initRunState());
        return Status::OK();
      });
  actor.Handle<schema::HeartbeatRequest, schema::HeartbeatReply>(
      m::kHeartbeat,
      [fleet](schema::HeartbeatRequest::Reader req, schema::HeartbeatReply::Builder rep) {
        rep.setKnown(fleet->Heartbeat(req.getName().cStr(), req.getPid(), req.getReady(),
                                      req.getProgress(), req.getAuthRefused()));
        ToWire(fleet->run_state(), rep.initRunState());
        return Status::OK();
      });
  actor.Handle<schema::LookupRequest, schema::LookupReply>(
      m::kLookup, [fleet](schema::LookupRequest::Reader req, schema::LookupReply::Builder rep) {
        ORRERY_ASSIGN_OR_RETURN(auto found, fleet->Lookup(req.getName().cStr()));
        rep.setName(found.first);
        rep.setEndpoint(found.second);
        return Status::OK();
      });
  actor.Handle<schema::SetRunStateRequest, schema::RunState>(
      m::kSetRunState,
      [fleet](schema::SetRunStateRequest::Reader req, schema::RunState::Builder rep) {
        RunState s =
            fleet->SetRunState(req.getPhase().cStr(), req.getStage(), req.getPolicyVersion());
        ORRERY_LOG(INFO) << "run state: phase " << s.phase << ", stage " << s.stage
                         << ", policy version " << s.policy_version;
        ToWire(s, rep);
        return Status::OK();
      });
  actor.Handle<schema::Empty, schema::FleetStatus>(
      m::kStatus, [fleet](schema::Empty::Reader, schema::FleetStatus::Builder rep) {
        ToWire(fleet->run_state(), rep.initRunState());
        rep.setStartedUnixMs(fleet->started_ms());
        const std::vector<ActorRecord> actors = fleet->Snapshot();
        auto list = rep.initActors(static_cast<unsigned>(actors.size()));
        for (size_t i = 0; i < actors.size(); ++i) {
          const ActorRecord& r = actors[i];
          auto a = list[static_cast<unsigned>(i)];
          a.setName(r.name);
          a.setRole(r.role);
          a.setIndex(static_cast<uint32_t>(r.index));
          a.setEndpoint(r.endpoint);
          a.setState(ActorStateName(r.state));
          a.setPid(r.pid);
          a.setHost(r.host);
          a.setRestarts(static_cast<uint32_t>(r.restarts));
          a.setLastHeartbeatUnixMs(r.last_heartbeat_ms);
          a.setLastExit(r.last_exit);
          a.setProgress(r.progress);
          a.setLastProgressUnixMs(r.last_progress_ms);
        }
        return Status::OK();
      });

  CoordinatorServer* self = server.get();
  server->thread_ = std::thread([self] {
    ScopedLogPrefix prefix("coordinator");
    Status s = self->actor_->Run(self->stop_);
    if (!s.ok()) ORRERY_LOG(ERROR) << s.message();
  });
  return server;
}

CoordinatorServer::~CoordinatorServer() { Stop(); }

void CoordinatorServer::Stop() {
  stop_.Cancel();
  if (thread_.joinable()) thread_.join();
}

}  // namespace orrery
