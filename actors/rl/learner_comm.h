// The communicator of one learner rank ([rl.learner] communicator): the local one for a single
// rank, else Gloo or NCCL, joined through RUN/rl/gloo with the start's generation
// (learner_rendezvous.h).
//
// Gloo ranks listen on the address the learner actor advertises (actors/runtime/advertise.h, from
// its --endpoint): fleet.host in a local tcp fleet, the pod IP (ORRERY_ADVERTISE_HOST) under
// Kubernetes, the node's host name under Slurm, 127.0.0.1 in an ipc fleet. A host name that
// resolves only to loopback (Debian's 127.0.1.1) is logged as a warning: ranks on other nodes
// could not reach this one. NCCL picks its own interfaces (NCCL_SOCKET_IFNAME).
//
// Gloo traffic is neither authenticated nor encrypted (Debian's Gloo has no TLS transport): the
// ranks must share a private network (docs/launch.md, "Security"). A Gloo rank whose listening
// host resolves to a globally routable address (PublicAddressOf) fails before it listens, unless
// allow_public_network ([rl.learner] gloo_public_network) accepts the exposure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "learner/comm/communicator.h"

namespace orrery::rl_actors {

struct LearnerCommOptions {
  int rank = 0;
  int world_size = 1;
  std::string communicator = "gloo";  // "gloo" or "nccl" (with more than one rank)
  std::string gloo_dir;               // RUN/rl/gloo: the stores live under it
  std::string generation = "0";
  int64_t timeout_ms = 60000;         // rendezvous and every collective
  std::string endpoint;               // the learner actor's endpoint (ActorContext::endpoint)
  bool allow_public_network = false;  // Gloo may listen on a globally routable address
};

// Blocks until every rank has joined (Gloo, NCCL), or fails with their error.
StatusOr<std::unique_ptr<comm::Communicator>> CreateLearnerCommunicator(
    const LearnerCommOptions& options);

}  // namespace orrery::rl_actors
