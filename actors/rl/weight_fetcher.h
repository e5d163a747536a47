// WeightFetcher: the rollout side of [rl.rollout] weights = "learner". It copies the newest policy
// version that learner rank 0 serves (WeightServer, actors/schema/weights.capnp) into a local
// WeightStore directory, from which the rollout loads it as it would a shared RUN/rl/weights.
//
//   WeightFetcher fetcher(zmq, "rollout:2", {.dir = state_dir + "/weights"});
//   ORRERY_RETURN_IF_ERROR(fetcher.Connect(learner_endpoint));
//   StatusOr<FetchStats> got = fetcher.FetchNewest(newer_than, &stop);  // a thread of its own
//
// The copy is chunked (each chunk checked against its CRC-32C and read again when damaged),
// resumable (bytes already in DIR/v-N.safetensors.part, from an earlier interrupted fetch of the
// same version, are kept: a version's file never changes once published), checked whole against
// the server's CRC-32C before it is renamed into place (a mismatch discards the part and starts
// over, once per call), and written with fsync, so a version in the directory is always whole.
// A version pruned on the learner during the fetch makes the call start again from Info. Older
// local versions beyond `keep` are deleted.
#pragma once

#include <cstdint>
#include <string>
#include <zmq.hpp>

#include "actors/runtime/cancellation.h"
#include "actors/runtime/client.h"
#include "core/status.h"

namespace orrery::rl_actors {

struct WeightFetchOptions {
  std::string dir;                                // the local WeightStore directory (created)
  int64_t chunk_bytes = 1ll << 20;                // asked per Read (capped by the server's maximum)
  int64_t keep = 3;                               // local versions kept
  std::chrono::milliseconds call_timeout{30000};  // per Info/Read call
  int chunk_attempts = 3;                         // reads of one chunk before the fetch fails
};

struct FetchStats {
  int64_t version = -1;       // the version now in dir (-1: nothing newer was served)
  int64_t bytes = 0;          // its file size
  int64_t bytes_fetched = 0;  // moved over the network by this call (less after a resume)
  int64_t resumed_at = 0;     // bytes of the part file kept from an earlier attempt
  int chunk_retries = 0;      // chunks read again after a CRC mismatch
  bool restarted = false;     // the whole file's CRC mismatched: the part was discarded once
  double seconds = 0;
};

class WeightFetcher {
 public:
  WeightFetcher(zmq::context_t& zmq, std::string self_name, WeightFetchOptions options);

  Status Connect(const std::string& endpoint);

  // Fetches the server's newest version when it is newer than `newer_than`; stats.version = -1
  // when it is not (or nothing is published yet). Errors: the server unreachable
  // (DeadlineExceeded/Unavailable: try again later), a chunk damaged `chunk_attempts` times or
  // the whole file twice (DataLoss), the local disk (IoError), Cancelled.
  StatusOr<FetchStats> FetchNewest(int64_t newer_than, const Cancellation* cancel);

 private:
  // Why a FetchOnce that failed may be tried again at once.
  enum class Retry { kNo, kPruned, kDamaged };
  StatusOr<FetchStats> FetchOnce(int64_t newer_than, const Cancellation* cancel, Retry* retry);

  ActorClient client_;
  WeightFetchOptions options_;
};

}  // namespace orrery::rl_actors
