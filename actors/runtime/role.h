// Actor roles: how a module plugs a long-lived service into the fleet.
//
// A role is a name and a main function. `orrery launch` starts every instance of a role as its
// own process (`orrery actor ROLE --index I ...`), tests and the single-process mode run it as a
// thread (ActorThread, actors/runtime/host.h); the main function is the same in both cases:
//
//   Status ReplayMain(ActorContext& ctx) {
//     ORRERY_ASSIGN_OR_RETURN(ReplayOptions opts, ReadReplayOptions(ctx.config_root()));
//     Actor actor(ctx.zmq(), ctx.name());
//     ORRERY_RETURN_IF_ERROR(actor.Bind(ctx.endpoint()));
//     actor.Handle<...>(...);
//     ctx.SetReady();                  // lookups of "replay" find this instance from now on
//     actor.Every(std::chrono::milliseconds(100), [&ctx] { ctx.Progress(); });  // liveness
//     return actor.Run(ctx.stop());    // returns when the fleet stops or SIGTERM arrives
//   }
//
//   // in RegisterReplayCommands(CliRegistry&), which runs when the CLI starts:
//   RegisterActorRole({"replay", "the RocksDB replay store", ReplayMain});
//
// Contract for a main function:
//   - bind ctx.endpoint() when the role serves requests (any transport: inproc, ipc or tcp; the
//     fleet config chooses; roles that only pull work, like rollout and learner, bind nothing),
//     call SetReady() once it works, and return when ctx.stop() is cancelled (promptly: the
//     launcher escalates to SIGKILL after fleet.shutdown_grace_ms);
//   - call Progress() from every iteration of its main loop (liveness, see ActorContext);
//   - return OK for a clean end, an error Status otherwise (the process then exits non-zero and
//     the coordinator restarts it with backoff, within the restart budget);
//   - keep durable state under ctx.state_dir(): a restarted instance gets the same directory;
//   - never let an exception escape (Actor::Run catches those of its handlers).
// An instance is named "<role>:<index>"; logs carry that name as prefix.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "actors/runtime/cancellation.h"
#include "core/config.h"
#include "core/status.h"

namespace orrery {

// The run's shared state (owned by the coordinator; refreshed with every heartbeat).
struct RunState {
  std::string phase = "starting";
  uint32_t stage = 0;
  uint64_t policy_version = 0;
  bool stopping = false;
};

// The link between one actor and the coordinator. Without a coordinator (a standalone actor),
// SetReady does nothing and Lookup fails with NotFound.
class FleetLink {
 public:
  virtual ~FleetLink() = default;
  virtual void SetReady() = 0;
  // Advances the progress counter that heartbeats carry (thread-safe, cheap: an atomic add).
  virtual void Progress() = 0;
  virtual RunState run_state() const = 0;
  // Endpoint of an actor ("replay:0") or of any ready instance of a role ("env"); waits up to
  // `wait` for it to register and be ready.
  virtual StatusOr<std::string> Lookup(const std::string& name_or_role,
                                       std::chrono::milliseconds wait) = 0;
  // Changes the shared run state ("" / -1 keep a field). Used by the roles that drive the run.
  virtual Status SetRunState(const std::string& phase, int64_t stage, int64_t policy_version) = 0;
};

class ActorContext {
 public:
  struct Fields {
    std::string role;
    int index = 0;
    std::string endpoint;
    std::string config_path;  // "" when started without a config file
    std::string state_dir;    // <run.dir>/actors/<role>-<index>
    std::string run_dir;      // <run.dir>: shared by every actor of the run
  };
  ActorContext(Fields fields, zmq::context_t& zmq, Cancellation& stop, FleetLink& fleet,
               ConfigDocument* config);

  const std::string& name() const { return name_; }  // "replay:0"
  const std::string& role() const { return fields_.role; }
  int index() const { return fields_.index; }
  // Where this instance's mailbox must listen.
  const std::string& endpoint() const { return fields_.endpoint; }
  // A directory for durable state, the same across restarts of this instance (created).
  const std::string& state_dir() const { return fields_.state_dir; }
  // The run directory every actor of the fleet shares (published weights, checkpoints, metrics).
  const std::string& run_dir() const { return fields_.run_dir; }
  const std::string& config_path() const { return fields_.config_path; }
  // The parsed config file (every section was validated before launch). An absent root when the
  // actor runs without a config: every getter then returns its default.
  ConfigTable config_root();

  zmq::context_t& zmq() { return zmq_; }
  // Cancelled when the actor must stop (SIGTERM/SIGINT, fleet shutdown, ActorThread::Stop).
  Cancellation& stop() { return stop_; }
  FleetLink& fleet() { return fleet_; }
  void SetReady() { fleet_.SetReady(); }
  // Liveness: the role's main loop calls this once per iteration, idle iterations included (a
  // learner past its last version, a rollout waiting for weights, a store without clients), and
  // so does any loop that retries or waits in bounded slices. From the first call on, an instance
  // whose counter has not advanced for fleet.progress_timeout_ms (a loop stuck inside one call)
  // is ended by its own process's watchdog (actors/runtime/progress_watchdog.h: under every
  // launcher) and restarted; heartbeats carry the counter to the coordinator, whose supervisor
  // also kills an instance that stays stalled past the watchdog. Roles that never call it are not
  // watched. No single call between two Progress() calls may legitimately take that
  // long (one learner update, one checkpoint write, one weight load).
  void Progress() { fleet_.Progress(); }

 private:
  Fields fields_;
  std::string name_;
  zmq::context_t& zmq_;
  Cancellation& stop_;
  FleetLink& fleet_;
  ConfigDocument* config_;
  std::optional<ConfigDocument> empty_config_;  // stands in when config_ is null
};

using ActorMain = std::function<Status(ActorContext&)>;

struct ActorRole {
  std::string name;  // [a-z][a-z0-9_]*: "replay", "env", "rollout", "learner"
  std::string help;  // one line, shown by `orrery actor --help` and in launch errors
  ActorMain main;
};

// Adds a role to the process-wide registry. A second registration of the same name, or a bad
// name, is a programming error: logged and ignored (the first one stays).
void RegisterActorRole(ActorRole role);
// Null when no such role is registered.
const ActorRole* FindActorRole(const std::string& name);
// Sorted.
std::vector<std::string> ActorRoleNames();

}  // namespace orrery
