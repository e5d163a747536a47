// The NCCL communicator: one rank per process, each on its own GPU, for data-parallel learner
// ranks in CUDA builds. Ranks meet through a directory every rank can see: rank 0 creates the
// ncclUniqueId and publishes it atomically as STORE_DIR/nccl-unique-id-GENERATION
// (rendezvous_file.h); the others wait for that file, then all join with a non-blocking
// ncclCommInitRankConfig on their device. Restarted ranks use a new generation, so they never
// read an id their dead predecessors left behind (the same contract as GlooOptions).
//
// Collectives take host spans (the Communicator contract: the learner's tensors are on the CPU):
// each call copies the data through a pinned staging buffer to a device buffer, runs the NCCL
// collective on the communicator's stream and copies the result back. Init and collectives are
// non-blocking and polled against the deadline, so a dead or stalled peer yields a Status
// (DeadlineExceeded, or Unavailable with NCCL's error) within timeout_ms, never a hang; the
// communicator is then aborted and every later collective fails with the same error.
//
// Not thread-safe: one thread issues the collectives, as with every Communicator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "learner/comm/communicator.h"

namespace orrery::comm {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = -1;        // this rank's CUDA device; -1: rank % the number of visible devices
  std::string store_dir;  // created if missing; rank 0 writes the unique id here
  std::string generation = "0";  // [A-Za-z0-9._-]+
  int64_t timeout_ms = 60000;    // the whole rendezvous (id file + init), and every collective
};

// Whether this build has NCCL (CUDA builds that found libnccl). Without it
// CreateNcclCommunicator fails with Unimplemented.
bool NcclAvailable();

// Blocks until every rank has joined (or the timeout passes: DeadlineExceeded). With NCCL,
// invalid options fail with InvalidArgument before any CUDA call.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options);

}  // namespace orrery::comm
