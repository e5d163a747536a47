// ReplayService: the replay actor's request handling, independent of the transport.
//
// It takes one encoded ReplayRequest from a peer and answers through `send` — at once, or later:
// an insert or sample the rate limiter refuses is parked (never blocking the caller's loop) and
// retried whenever the table changes, and answered with DeadlineExceeded at its deadline; in
// group-commit mode every reply that follows a write (insert, sample, priority update, learner
// version, acknowledgement) is held until that write's WAL fsync, so no client ever sees state
// that a power loss could take back, and when a write or WAL sync fails the replies still waiting
// get that storage error; a checkpoint runs on its own thread. Parked requests are bounded per
// table and per client (count and payload bytes, ReplayConfig): beyond a limit a request is
// answered with ResourceExhausted at once. Malformed, truncated or
// oversized messages and unknown tables get an error reply; nothing a client sends can stop the
// service.
//
// Not thread-safe: one loop (ReplayServer, or an actor runtime's loop) calls it.
#pragma once

#include <capnp/common.h>
#include <kj/array.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "actors/replay/store.h"

namespace orrery::replay {

class ReplayService {
 public:
  // Sends an encoded ReplayReply to `peer` (a ZeroMQ routing id).
  using SendFn = std::function<void(const std::string& peer, kj::Array<capnp::word> reply)>;

  ReplayService(ReplayStore* store, SendFn send);
  ~ReplayService();

  void HandleRequest(const std::string& peer, std::string_view bytes);
  // Retries parked requests, answers expired ones, releases durable acks and finished
  // checkpoints. Cheap when nothing is pending; call after every batch of requests and at least
  // every PollIntervalMs().
  void Poll();
  // How long the loop may sleep before the next Poll(): -1 when nothing is pending.
  int64_t PollIntervalMs() const;
  size_t parked() const { return parked_.size(); }
  // Answers every pending request with Cancelled (shutdown).
  void CancelAll();

 private:
  struct Parked;
  struct PendingReply;
  struct PendingCheckpoint;

  void Reply(const std::string& peer, uint64_t id, const Status& error);
  // Tries a parked insert or sample once; true when it was answered.
  bool TryParked(Parked& p);
  struct Load {
    int64_t requests = 0, bytes = 0;
  };

  // Sends `reply` (to request `id`) once storage ticket `ticket` is durable (at once when it is).
  void SendWhenDurable(const std::string& peer, uint64_t id, uint64_t ticket,
                       kj::Array<capnp::word> reply);
  Status CheckParkLimits(const Parked& p) const;
  // Adds (+1) or removes (-1) a parked request from the per-table and per-client loads.
  void Count(const Parked& p, int sign);
  void AnswerInsert(const std::string& peer, uint64_t id, const InsertOutcome& out);

  ReplayStore* store_;
  SendFn send_;
  std::deque<std::unique_ptr<Parked>> parked_;
  std::deque<PendingReply> pending_;  // replies waiting for their write's fsync
  std::unordered_map<Table*, Load> parked_by_table_;
  std::unordered_map<std::string, Load> parked_by_peer_;
  std::deque<std::unique_ptr<PendingCheckpoint>> checkpoints_;
};

}  // namespace orrery::replay
