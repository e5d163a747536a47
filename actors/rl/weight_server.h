// WeightServer: serves the policy versions of a WeightStore directory over the actor transport
// (actors/schema/weights.capnp), so rollout actors on hosts that do not share the learner's
// filesystem can follow the policy ([rl.rollout] weights = "learner"; the client is
// WeightFetcher).
//
//   Actor actor(zmq, "learner:0");
//   ORRERY_RETURN_IF_ERROR(actor.Bind(endpoint));
//   WeightServer server(paths.weights);
//   server.Register(actor);         // weights.Info, weights.Read
//   actor.Run(stop);                // on its own thread: the learner keeps training
//
// The server only reads: the learner publishes into the directory as before (temp + rename, so a
// file the server sees is whole) and prunes old versions; a Read of a pruned version is NotFound.
// Checksums are computed once per version (on its first Info) and kept for the newest few.
// Requests are validated against the file: a version is a number (never a path), a range must
// lie inside the file and be at most max_chunk_bytes long. (What fits in one message is the
// receiver's limit: WeightFetcher asks for chunks within its own.)
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "actors/runtime/actor.h"
#include "core/status.h"

namespace orrery::rl_actors {

class WeightServer {
 public:
  static constexpr int64_t kDefaultMaxChunkBytes = 64ll << 20;

  explicit WeightServer(std::string dir, int64_t max_chunk_bytes = kDefaultMaxChunkBytes);

  // Registers weights.Info and weights.Read on `actor`. The server must outlive the actor's loop.
  void Register(Actor& actor);

 private:
  struct FileSum {
    int64_t bytes = 0;
    uint32_t crc32 = 0;
  };
  // The size and CRC-32C of `version`'s file (cached).
  StatusOr<FileSum> Sum(int64_t version);

  std::string dir_;
  int64_t max_chunk_bytes_;
  std::map<int64_t, FileSum> sums_;  // newest few versions
};

}  // namespace orrery::rl_actors
