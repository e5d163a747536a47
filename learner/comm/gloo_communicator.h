// The Gloo communicator: ranks are processes (on one or many hosts) that meet through a
// FileStore directory every rank can see (a shared filesystem across hosts) and then talk over
// TCP (ring all-reduce). Rendezvous keys are prefixed with `generation`, so ranks restarted
// after a crash (generation + 1) never read the addresses their dead predecessors left behind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "learner/comm/communicator.h"

namespace orrery::comm {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  std::string store_dir;  // created if missing
  std::string generation = "0";
  std::string hostname = "127.0.0.1";  // the address this rank listens on
  int64_t timeout_ms = 60000;          // rendezvous and every collective
};

// Blocks until every rank has joined (or the timeout passes: DeadlineExceeded).
//
// Gloo's TCP transport writes to its sockets with writev, which raises SIGPIPE when a peer has
// died; so that a dead peer becomes an Unavailable status on the next collective rather than the
// death of this process too, the first call sets SIGPIPE to SIG_IGN unless the process already
// installed a handler of its own (a handler other than SIG_DFL is left as it is).
StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options);

}  // namespace orrery::comm
