// EnvClient: what a rollout actor uses to drive episodes of a remote environment server
// (EnvServer, `orrery env serve`, the "env" role).
//
//   EnvClient client(zmq, "rollout:0");
//   ORRERY_RETURN_IF_ERROR(client.Connect(endpoint));
//   ORRERY_ASSIGN_OR_RETURN(RemoteEpisode ep, client.Reset("calc", env::Split::kTrain, 7));
//   ORRERY_ASSIGN_OR_RETURN(env::ToolResult r, client.Step(ep.id, call));
//   ORRERY_ASSIGN_OR_RETURN(env::EpisodeScore s, client.Score(ep.id, trajectory));
//   client.Close(ep.id);
//
// Every call has a deadline (options.timeout, or the one given) that travels to the server,
// which runs the environment call under it. Restarts: when a call times out or the server is
// unreachable, the client drops its connection (and anything queued on it) and reconnects, then
// asks the server for its incarnation: if it changed, the episode's call fails with
// IsEpisodeLost() ("episode lost: ..."), and the caller re-issues the task with a new Reset. A
// server that answers a call for an episode of its previous incarnation says the same. The
// client is one DEALER socket: use it from one thread at a time (one client per thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "actors/runtime/cancellation.h"
#include "actors/runtime/client.h"
#include "core/chat.h"
#include "core/status.h"
#include "env/env.h"

namespace orrery::envserver {

struct EnvClientOptions {
  std::chrono::milliseconds timeout{30000};       // default deadline of a call
  std::chrono::milliseconds probe_timeout{1000};  // the incarnation check after a failure
  const Cancellation* cancel = nullptr;           // optional: ends any wait at once
};

struct EnvServerInfo {
  uint64_t incarnation = 0;
  std::vector<std::string> envs;
  uint32_t open_episodes = 0;
  std::string served_by;
};

struct RemoteEpisode {
  std::string id;  // pass to Step/Score/Close
  env::TaskRef task;
  std::vector<ChatMessage> messages;  // the initial messages
  std::vector<env::ToolSpec> tools;
};

// True for the error of a call on an episode that a restarted server no longer has.
bool IsEpisodeLost(const Status& status);

class EnvClient {
 public:
  EnvClient(zmq::context_t& zmq, std::string self_name, EnvClientOptions options = {});

  // Connects (ZeroMQ connects in the background: this succeeds before the server is up).
  Status Connect(const std::string& endpoint);
  const std::string& endpoint() const { return endpoint_; }

  // The deadline of the calls that follow (options.timeout until set).
  void set_timeout(std::chrono::milliseconds timeout) { options_.timeout = timeout; }

  StatusOr<EnvServerInfo> Describe();
  StatusOr<env::TaskRef> Task(const std::string& env, env::Split split, uint64_t index);
  StatusOr<RemoteEpisode> Reset(const std::string& env, env::Split split, uint64_t index);
  StatusOr<env::ToolResult> Step(const std::string& episode_id, const ToolCall& call);
  StatusOr<env::EpisodeScore> Score(const std::string& episode_id,
                                    const std::vector<ChatMessage>& trajectory);
  // True when the episode was open. Idempotent.
  StatusOr<bool> Close(const std::string& episode_id);

 private:
  CallOptions Call() const { return CallOptions{options_.timeout, options_.cancel}; }
  // After a failed call: reconnects on a transport failure, and turns the failure into "episode
  // lost" when the server now has another incarnation than the one that opened `episode_id`.
  Status AfterFailure(const Status& status, const std::string& episode_id);

  zmq::context_t& zmq_;
  std::string name_;
  EnvClientOptions options_;
  std::string endpoint_;
  ActorClient client_;
};

}  // namespace orrery::envserver
