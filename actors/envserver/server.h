// EnvServer: hosts many concurrent episodes of one or more environments behind a ZeroMQ ROUTER
// mailbox, speaking actors/schema/env.capnp in the actor runtime's two-frame format (so any
// ActorClient, and EnvClient, can call it).
//
// Why not actors/runtime/actor.h: an Actor runs its handlers one at a time on the loop thread,
// and a sandboxed step may take seconds. Here the loop only parses, routes and replies; Reset,
// Step and Score run on a pool of worker threads and their replies are sent when they finish, so
// a slow step of one episode never delays the others (nor Describe/Close).
//
// Episodes: ids are "<incarnation hex>-<counter>"; the incarnation is random per server start,
// so a request naming an episode of an earlier incarnation (the server was restarted) gets
// NotFound "episode lost: ..." (IsEpisodeLost in client.h), and the caller re-issues the task.
// One call per episode at a time (a second one gets FailedPrecondition). Episodes untouched for
// idle_timeout_s are closed. Calls run under the caller's deadline (from the envelope), capped
// at max_call_s; a request whose deadline passed while queued is answered DeadlineExceeded
// without running. Malformed messages get an InvalidArgument reply and the server keeps serving.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "actors/envserver/server_options.h"
#include "actors/runtime/cancellation.h"
#include "actors/runtime/wire.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "env/env.h"

namespace orrery::envserver {

class EnvServer {
 public:
  // `name` is the actor name used in replies and logs ("env:0").
  EnvServer(zmq::context_t& zmq, std::string name, std::vector<std::unique_ptr<env::Env>> envs,
            const EnvServerOptions& options);
  ~EnvServer();  // waits for running calls (they are bounded by their deadlines)
  EnvServer(const EnvServer&) = delete;
  EnvServer& operator=(const EnvServer&) = delete;

  // Errors name the endpoint. tcp://127.0.0.1:* picks a free port (see endpoint()); tcp is a CURVE
  // server when the process has the fleet's keys (actors/runtime/fleet_curve.h).
  Status Bind(const std::string& endpoint);
  const std::string& endpoint() const { return endpoint_; }
  uint64_t incarnation() const { return incarnation_; }
  std::vector<std::string> env_names() const;

  // Serves until `stop` is cancelled, then returns OK (calls still running finish in the
  // background; their replies are dropped). Error only when the mailbox fails. `on_iteration`
  // (when set) runs once per turn of the loop, at least every 200 ms unless a request blocks it
  // (liveness: the env role advances its progress counter there).
  Status Run(const Cancellation& stop, const std::function<void()>& on_iteration = nullptr);

 private:
  struct Slot {
    std::unique_ptr<env::Episode> episode;
    bool busy = false;
    bool close_when_idle = false;
    std::chrono::steady_clock::time_point last_used;
  };
  // A finished worker call: the reply to send, and what it did to the episode table.
  struct Done {
    std::string identity;
    Envelope envelope;  // the reply envelope (status set)
    std::unique_ptr<capnp::MallocMessageBuilder> body;
    std::string episode_id;
    std::unique_ptr<env::Episode> new_episode;  // Reset only
    bool was_reset = false;
  };
  struct Request;

  void ServeOne();
  Status Describe(capnp::MallocMessageBuilder& reply);
  Status StartTask(Request& request);
  Status StartReset(Request& request);
  Status StartEpisodeCall(Request& request);
  Status CloseEpisode(Request& request, capnp::MallocMessageBuilder& reply);
  StatusOr<Slot*> FindEpisode(const std::string& id);
  // Runs `work` on a worker; its Done (reply, episode effects) returns to the loop.
  void Submit(Request& request, std::string episode_id, bool is_reset,
              std::function<Status(Done&)> work);
  void Finish(Done done);  // any thread
  void DrainDone();
  void ExpireIdle();
  env::Deadline CallDeadline(int64_t deadline_unix_ms) const;

  std::string name_;
  EnvServerOptions options_;
  uint64_t incarnation_;
  std::string incarnation_hex_;
  uint64_t next_episode_ = 0;
  int pending_resets_ = 0;
  zmq::context_t& zmq_;
  zmq::socket_t socket_;
  std::string endpoint_;
  int done_fd_;  // eventfd: workers signal finished calls
  std::atomic<bool> stopping_{false};

  // The destructor joins the pool first; then finished calls and episodes go (reverse order of
  // declaration), then the environments they belong to.
  std::map<std::string, std::unique_ptr<env::Env>> envs_;
  std::map<std::string, Slot> episodes_;  // loop thread only
  std::mutex done_mu_;
  std::deque<Done> done_;
  std::unique_ptr<ThreadPool> pool_;  // joined first in the destructor
};

}  // namespace orrery::envserver
