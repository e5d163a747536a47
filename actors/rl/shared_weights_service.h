// The fleet's side of shared weights ([rl.rollout] weights = "shared"; model/shared_weights.h):
// learner rank 0 answers weights.Shared and weights.Release (actors/schema/weights.capnp) on its
// endpoint, from a thread of its own beside WeightServer, and each rollout on its host asks for
// the newest version between decode steps.
//
//   learner:  RegisterSharedWeights(actor, publisher.get());    // then actor.Run on its thread
//   rollout:  SharedWeightClient client(zmq, "rollout:0");
//             client.Connect(learner_endpoint);
//             StatusOr<SharedUpdate> got = client.Fetch(version, backend->WeightTargets());
//
// A version is announced the way WeightServer announces files (the reader asks; the reply names
// the newest version), and moves without a file: the reply names the buffer, the reader maps it
// and copies device to device. Readers on another host (another boot id) are told so in one line
// and keep to the files; so are readers of a learner that shares nothing (its publisher is null).
#pragma once

#include <cstdint>
#include <string>
#include <zmq.hpp>

#include "actors/runtime/actor.h"
#include "actors/runtime/client.h"
#include "core/status.h"
#include "model/shared_weights.h"

namespace orrery::rl_actors {

// This machine's boot id (/proc/sys/kernel/random/boot_id, "" when unreadable): processes that
// share it run on one kernel, so one can map the other's buffers.
std::string HostBootId();

// Registers weights.Shared and weights.Release on `actor`, answered from `publisher`, which must
// outlive the actor's loop (null: every reader is told that nothing is shared).
void RegisterSharedWeights(Actor& actor, model::SharedWeightPublisher* publisher);

struct SharedUpdate {
  int64_t version = -1;         // the version now in the targets; -1: nothing newer was shared
  double transfer_seconds = 0;  // the copy into the targets, synchronised
  double published_at = 0;      // when the learner began its copy (Unix seconds, its clock)
  int64_t bytes = 0;
};

class SharedWeightClient {
 public:
  SharedWeightClient(zmq::context_t& zmq, std::string self_name);
  Status Connect(const std::string& endpoint);

  // Copies the learner's newest version into `targets` when it is newer than `newer_than`.
  // Errors, by what the caller must do:
  //   - DataLoss: the copy began and is not whole (it failed part-way, or the lease expired while
  //     it ran): `targets` hold a mix of versions; load a whole version before decoding again.
  //   - FailedPrecondition: the learner shares nothing with this reader (another host, or no
  //     publisher): keep to the files for good.
  //   - anything else (the learner unreachable, a layout that does not match): `targets` are
  //     untouched; use the files this time.
  StatusOr<SharedUpdate> Fetch(int64_t newer_than, const model::NamedTensors& targets);

 private:
  ActorClient client_;
  std::string host_;
  uint32_t layout_crc_ = 0;
  bool have_layout_ = false;
  model::SharedWeightLayout layout_;
  model::SharedWeightReader reader_;
};

}  // namespace orrery::rl_actors
