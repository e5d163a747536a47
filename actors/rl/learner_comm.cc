#include "actors/rl/learner_comm.h"

#include "actors/runtime/advertise.h"
#include "core/logging.h"
#include "learner/comm/gloo_communicator.h"
#include "learner/comm/nccl_communicator.h"

namespace orrery::rl_actors {

StatusOr<std::unique_ptr<comm::Communicator>> CreateLearnerCommunicator(
    const LearnerCommOptions& o) {
  if (o.world_size == 1) return comm::MakeLocalCommunicator();
  if (o.communicator == "nccl") {
    comm::NcclOptions n;
    n.rank = o.rank;
    n.world_size = o.world_size;
    n.store_dir = o.gloo_dir + "/nccl";
    n.generation = o.generation;
    n.timeout_ms = o.timeout_ms;
    return comm::CreateNcclCommunicator(n);
  }
  comm::GlooOptions g;
  g.rank = o.rank;
  g.world_size = o.world_size;
  g.store_dir = o.gloo_dir + "/store";
  g.generation = o.generation;
  g.timeout_ms = o.timeout_ms;
  g.hostname = AdvertisedHost(o.endpoint);
  if (const std::string address = PublicAddressOf(g.hostname);
      !address.empty() && !o.allow_public_network) {
    return FailedPreconditionError(
        "gloo: learner rank " + std::to_string(o.rank) + " would listen on " + g.hostname + " (" +
        address +
        "), a public address, and Gloo's traffic is neither authenticated nor encrypted: put the "
        "learner ranks on a private network (fleet.host, ORRERY_ADVERTISE_HOST), or set "
        "[rl.learner] gloo_public_network = true to accept that");
  }
  if (IsWildcardTcp(o.endpoint) && ResolvesOnlyToLoopback(g.hostname)) {
    ORRERY_LOG(WARN) << "gloo listens on " << g.hostname
                     << ", which resolves only to loopback: learner ranks on other machines "
                        "cannot reach this rank (set ORRERY_ADVERTISE_HOST to this node's "
                        "address, or make its host name resolve to it)";
  }
  ORRERY_LOG(INFO) << "gloo rank " << o.rank << " of " << o.world_size << " listens on "
                   << g.hostname;
  return comm::CreateGlooCommunicator(g);
}

}  // namespace orrery::rl_actors
