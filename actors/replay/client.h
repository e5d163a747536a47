// ReplayClient: the C++ client of the replay actor (a DEALER socket; one request at a time).
//
//   ORRERY_ASSIGN_OR_RETURN(auto client, ReplayClient::Connect("tcp://127.0.0.1:5555"));
//   ORRERY_ASSIGN_OR_RETURN(InsertReply r, client->Insert("trajectories", item));
//   ORRERY_ASSIGN_OR_RETURN(auto batch, client->Sample("trajectories", {8, version, step}, 1000));
//
// timeout_ms bounds how long the store may block the call on its rate limiter (< 0: forever,
// 0: not at all); the client additionally gives up `reply_grace_ms` later when the store does not
// answer at all (Unavailable), so a dead store never hangs a caller with a deadline. Not
// thread-safe: use one client per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "actors/replay/table.h"

namespace orrery::replay {

struct ReplayClientOptions {
  int64_t reply_grace_ms = 10000;
};

struct InsertReply {
  uint64_t key = 0;
  bool dropped_stale = false;
  bool duplicate = false;  // a retry: the first insert with this idempotency key stored the group
};

class ReplayClient {
 public:
  // `context` may be null: the client then owns one. A tcp endpoint is reached over CURVE when the
  // process has the fleet's keys (actors/runtime/fleet_curve.h).
  static StatusOr<std::unique_ptr<ReplayClient>> Connect(const std::string& endpoint,
                                                         zmq::context_t* context = nullptr,
                                                         ReplayClientOptions options = {});
  ~ReplayClient();

  // Give item.idempotency_key when the call may be retried (Unavailable, DeadlineExceeded): a
  // retry with the same key is answered with the first insert's reply, never stored twice.
  StatusOr<InsertReply> Insert(const std::string& table, const ItemInput& item,
                               int64_t timeout_ms = -1);
  StatusOr<std::vector<SampledItem>> Sample(const std::string& table, const SampleOptions& options,
                                            int64_t timeout_ms = -1);
  StatusOr<UpdateOutcome> UpdatePriorities(const std::string& table,
                                           const std::vector<std::pair<uint64_t, double>>& updates,
                                           const std::vector<uint64_t>& deletes = {});
  StatusOr<int64_t> SetLearnerVersion(const std::string& table, int64_t version);
  // Deletes what `claimant` claimed for batch steps <= through_step (SampleOptions::claimant);
  // returns how many items. Call once the claimant's own record of those batches is safe.
  StatusOr<int64_t> Acknowledge(const std::string& table, const std::string& claimant,
                                int64_t through_step);
  StatusOr<std::vector<TableInfo>> Info();
  // Returns the checkpoint directory: `directory` (a name under the store's replay.checkpoint_dir,
  // checkpoint_directory.h) or, when empty, a new one the store names there.
  StatusOr<std::string> Checkpoint(const std::string& directory = "");

  // Sends arbitrary bytes as a request and returns the reply's bytes (tests of bad input).
  StatusOr<std::string> CallRaw(const std::string& bytes, int64_t wait_ms);

 private:
  ReplayClient(std::unique_ptr<zmq::context_t> owned, zmq::context_t* context,
               ReplayClientOptions options);
  Status NotConnected() const;
  // Sends the encoded request and waits for the reply with the same id.
  StatusOr<std::string> Call(const std::string& request, uint64_t id, int64_t timeout_ms);

  std::unique_ptr<zmq::context_t> owned_context_;
  zmq::context_t* context_;
  zmq::socket_t socket_;
  ReplayClientOptions options_;
  std::string endpoint_;
  uint64_t next_id_ = 1;
};

}  // namespace orrery::replay
