// RemoteEnv: an env::Env whose episodes live on environment servers (EnvServer: `orrery env
// serve`, or a fleet's "env" role), driven through EnvClient. A rollout actor with
// `[rl.rollout] env = "remote"` runs its agent loop on one, so sandboxes run on other processes or
// machines while the loop and its env workers stay as they are.
//
//   auto env = RemoteEnv::Create(zmq, "rollout:0", {"calc", {"tcp://h1:5600", "tcp://h2:5600"}});
//   env->Task(Split::kTrain, 7)   -> env.Task on the first server (ids and seeds are the server's)
//   env->Reset(task, deadline)    -> env.Reset on the next server, round robin
//   episode->Step / Score         -> env.Step / env.Score on the server that opened it
//
// Thread-safe as env/env.h asks: each call borrows an EnvClient of its server from a free list
// (one DEALER socket per concurrent caller, created on demand), so many env workers call at once.
// Each call's deadline travels to the server. Failures keep env/env.h's meaning: DeadlineExceeded
// when a call timed out, Unavailable when the episode is lost (its server restarted, see
// IsEpisodeLost, or stopped answering), so the agent loop ends such an episode as an
// environment fault. An episode is closed on the server after its Score, or by a background
// closer when it is dropped unscored (episodes the server loses expire there by themselves).
#pragma once

#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/status.h"
#include "env/env.h"

namespace orrery::envserver {

struct RemoteEnvOptions {
  std::string env;                     // the served environment's name ([env].name)
  std::vector<std::string> endpoints;  // the servers; at least one
};

// Connects (in the background, as ZeroMQ does); `zmq` must outlive the environment.
StatusOr<std::unique_ptr<env::Env>> CreateRemoteEnv(zmq::context_t& zmq,
                                                    const std::string& self_name,
                                                    const RemoteEnvOptions& options);

}  // namespace orrery::envserver
