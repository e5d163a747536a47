#include "actors/replay/service.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <thread>

#include "actors/replay/capnp_io.h"
#include "actors/replay/checkpoint_directory.h"
#include "actors/replay/wire.h"
#include "core/logging.h"
#include "core/metrics.h"

namespace orrery::replay {

using Clock = std::chrono::steady_clock;

struct ReplayService::Parked {
  std::string peer;
  uint64_t id = 0;
  int64_t bytes = 0;  // the insert's payload
  Table* table = nullptr;
  bool is_insert = false;
  ItemInput item;
  SampleOptions sample;
  Deadline deadline;
  Clock::time_point start;
  double start_unix = 0;
};

struct ReplayService::PendingReply {
  std::string peer;
  uint64_t id;
  uint64_t ticket;
  kj::Array<capnp::word> reply;
};

struct ReplayService::PendingCheckpoint {
  std::string peer;
  uint64_t id;
  std::future<StatusOr<std::string>> result;
};

ReplayService::ReplayService(ReplayStore* store, SendFn send)
    : store_(store), send_(std::move(send)) {}

ReplayService::~ReplayService() {
  for (auto& c : checkpoints_) c->result.wait();
}

void ReplayService::Reply(const std::string& peer, uint64_t id, const Status& error) {
  capnp::MallocMessageBuilder builder;
  auto reply = builder.initRoot<schema::ReplayReply>();
  reply.setId(id);
  FillError(error, reply.initError());
  send_(peer, capnp::messageToFlatArray(builder));
}

void ReplayService::SendWhenDurable(const std::string& peer, uint64_t id, uint64_t ticket,
                                    kj::Array<capnp::word> reply) {
  if (ticket <= store_->storage()->durable_ticket()) {
    send_(peer, std::move(reply));
    return;
  }
  pending_.push_back({peer, id, ticket, std::move(reply)});
}

Status ReplayService::CheckParkLimits(const Parked& p) const {
  const ReplayConfig& c = store_->config();
  auto over = [&](const Load& load, int64_t max_requests, int64_t max_bytes) {
    return load.requests + 1 > max_requests || load.bytes + p.bytes > max_bytes;
  };
  auto describe = [&](const Load& load) {
    return std::to_string(load.requests) + " parked requests holding " +
           std::to_string(load.bytes) + " bytes";
  };
  if (auto it = parked_by_table_.find(p.table);
      it != parked_by_table_.end() &&
      over(it->second, c.max_parked_per_table, c.max_parked_bytes_per_table)) {
    return ResourceExhaustedError(
        "replay table '" + p.table->name() + "' already has " + describe(it->second) +
        " (max_parked_per_table " + std::to_string(c.max_parked_per_table) +
        ", max_parked_mb_per_table " + std::to_string(c.max_parked_bytes_per_table >> 20) +
        "): retry later");
  }
  if (auto it = parked_by_peer_.find(p.peer);
      it != parked_by_peer_.end() &&
      over(it->second, c.max_parked_per_client, c.max_parked_bytes_per_client)) {
    return ResourceExhaustedError(
        "replay: this client already has " + describe(it->second) + " (max_parked_per_client " +
        std::to_string(c.max_parked_per_client) + ", max_parked_mb_per_client " +
        std::to_string(c.max_parked_bytes_per_client >> 20) + "): retry later");
  }
  if (p.bytes > c.max_parked_bytes_per_table || p.bytes > c.max_parked_bytes_per_client) {
    return ResourceExhaustedError("replay: an insert of " + std::to_string(p.bytes) +
                                  " bytes cannot be parked (max_parked_mb_per_table " +
                                  std::to_string(c.max_parked_bytes_per_table >> 20) +
                                  ", max_parked_mb_per_client " +
                                  std::to_string(c.max_parked_bytes_per_client >> 20) + ")");
  }
  return Status::OK();
}

void ReplayService::Count(const Parked& p, int sign) {
  for (Load* load : {&parked_by_table_[p.table], &parked_by_peer_[p.peer]}) {
    load->requests += sign;
    load->bytes += sign * p.bytes;
  }
  if (sign < 0) {
    if (parked_by_table_[p.table].requests == 0) parked_by_table_.erase(p.table);
    if (parked_by_peer_[p.peer].requests == 0) parked_by_peer_.erase(p.peer);
  }
}

void ReplayService::AnswerInsert(const std::string& peer, uint64_t id, const InsertOutcome& out) {
  capnp::MallocMessageBuilder builder;
  auto reply = builder.initRoot<schema::ReplayReply>();
  reply.setId(id);
  auto ins = reply.initInsert();
  ins.setKey(out.key);
  ins.setDroppedStale(out.dropped_stale);
  ins.setDuplicate(out.duplicate);
  SendWhenDurable(peer, id, out.ticket, capnp::messageToFlatArray(builder));
}

bool ReplayService::TryParked(Parked& p) {
  if (p.is_insert) {
    StatusOr<std::optional<InsertOutcome>> out = p.table->TryInsert(p.item);
    if (out.ok() && !out->has_value()) return false;
    p.table->RecordBlocked(BlockedOp::kInsert, p.start_unix,
                           std::chrono::duration<double>(Clock::now() - p.start).count());
    if (!out.ok()) {
      Reply(p.peer, p.id, out.status());
    } else {
      AnswerInsert(p.peer, p.id, **out);
    }
    return true;
  }
  uint64_t ticket = 0;
  StatusOr<std::vector<SampledItem>> out = p.table->TrySample(p.sample, &ticket);
  if (out.ok() && out->empty()) return false;
  p.table->RecordBlocked(BlockedOp::kSample, p.start_unix,
                         std::chrono::duration<double>(Clock::now() - p.start).count());
  if (!out.ok()) {
    Reply(p.peer, p.id, out.status());
    return true;
  }
  capnp::MallocMessageBuilder builder;
  auto reply = builder.initRoot<schema::ReplayReply>();
  reply.setId(p.id);
  auto list = reply.initSample(static_cast<unsigned>(out->size()));
  for (size_t i = 0; i < out->size(); ++i)
    FillSampledItem((*out)[i], list[static_cast<unsigned>(i)]);
  SendWhenDurable(p.peer, p.id, ticket, capnp::messageToFlatArray(builder));
  return true;
}

void ReplayService::HandleRequest(const std::string& peer, std::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) > store_->config().max_message_bytes) {
    Reply(peer, 0,
          ResourceExhaustedError("replay: request of " + std::to_string(bytes.size()) +
                                 " bytes exceeds max_message_bytes " +
                                 std::to_string(store_->config().max_message_bytes)));
    return;
  }
  uint64_t id = 0;
  std::unique_ptr<Parked> park;
  Status status = ReadCapnpMessage<schema::ReplayRequest>(
      bytes, "replay request", [&](schema::ReplayRequest::Reader req) -> Status {
        id = req.getId();
        const Deadline deadline = DeadlineFromTimeoutMs(req.getTimeoutMs());
        switch (req.which()) {
          case schema::ReplayRequest::INSERT: {
            auto in = req.getInsert();
            ORRERY_ASSIGN_OR_RETURN(Table * table, store_->Find(in.getTable()));
            park = std::make_unique<Parked>();
            park->table = table;
            park->is_insert = true;
            park->item.group_id = in.getGroupId();
            park->item.priority = in.getPriority();
            park->item.tokens = in.getTokens();
            park->item.min_policy_version = in.getMinPolicyVersion();
            auto idempotency_key = in.getIdempotencyKey();
            park->item.idempotency_key.assign(
                reinterpret_cast<const char*>(idempotency_key.begin()), idempotency_key.size());
            for (auto d : in.getTrajectories()) {
              park->item.trajectories.emplace_back(reinterpret_cast<const char*>(d.begin()),
                                                   d.size());
              park->bytes += static_cast<int64_t>(d.size());
            }
            break;
          }
          case schema::ReplayRequest::SAMPLE: {
            auto in = req.getSample();
            ORRERY_ASSIGN_OR_RETURN(Table * table, store_->Find(in.getTable()));
            if (in.getMaxItems() < 1 || in.getMaxItems() > 1 << 16) {
              return InvalidArgumentError("replay sample: maxItems must be in [1, 65536], got " +
                                          std::to_string(in.getMaxItems()));
            }
            park = std::make_unique<Parked>();
            park->table = table;
            park->sample.max_items = static_cast<int>(in.getMaxItems());
            park->sample.learner_version = in.getLearnerVersion();
            park->sample.batch_step = in.getBatchStep();
            park->sample.claimant = in.getClaimant();
            park->sample.claim_session = in.getClaimSession();
            break;
          }
          case schema::ReplayRequest::UPDATE_PRIORITIES: {
            auto in = req.getUpdatePriorities();
            ORRERY_ASSIGN_OR_RETURN(Table * table, store_->Find(in.getTable()));
            auto keys = in.getKeys();
            auto prios = in.getPriorities();
            if (keys.size() != prios.size()) {
              return InvalidArgumentError("replay update: " + std::to_string(keys.size()) +
                                          " keys but " + std::to_string(prios.size()) +
                                          " priorities");
            }
            std::vector<std::pair<uint64_t, double>> updates;
            for (unsigned i = 0; i < keys.size(); ++i) updates.emplace_back(keys[i], prios[i]);
            std::vector<uint64_t> deletes;
            for (uint64_t k : in.getDeleteKeys()) deletes.push_back(k);
            ORRERY_ASSIGN_OR_RETURN(UpdateOutcome out, table->UpdatePriorities(updates, deletes));
            capnp::MallocMessageBuilder builder;
            auto reply = builder.initRoot<schema::ReplayReply>();
            reply.setId(id);
            auto u = reply.initUpdatePriorities();
            u.setUpdated(static_cast<uint32_t>(out.updated));
            u.setDeleted(static_cast<uint32_t>(out.deleted));
            u.setMissing(static_cast<uint32_t>(out.missing));
            SendWhenDurable(peer, id, out.ticket, capnp::messageToFlatArray(builder));
            return Status::OK();
          }
          case schema::ReplayRequest::INFO: {
            capnp::MallocMessageBuilder builder;
            auto reply = builder.initRoot<schema::ReplayReply>();
            reply.setId(id);
            std::vector<Table*> tables = store_->tables();
            auto list = reply.initInfo(static_cast<unsigned>(tables.size()));
            for (size_t i = 0; i < tables.size(); ++i) {
              FillTableInfo(tables[i]->Info(), list[static_cast<unsigned>(i)]);
            }
            send_(peer, capnp::messageToFlatArray(builder));
            return Status::OK();
          }
          case schema::ReplayRequest::CHECKPOINT: {
            auto pending = std::make_unique<PendingCheckpoint>();
            pending->peer = peer;
            pending->id = id;
            ORRERY_ASSIGN_OR_RETURN(std::string dir,
                                    CheckpointDirectoryUnder(store_->config().checkpoint_root,
                                                             req.getCheckpoint().getDirectory()));
            pending->result = std::async(std::launch::async,
                                         [store = store_, dir] { return store->Checkpoint(dir); });
            checkpoints_.push_back(std::move(pending));
            return Status::OK();
          }
          case schema::ReplayRequest::SET_LEARNER_VERSION: {
            auto in = req.getSetLearnerVersion();
            ORRERY_ASSIGN_OR_RETURN(Table * table, store_->Find(in.getTable()));
            uint64_t ticket = 0;
            ORRERY_ASSIGN_OR_RETURN(int64_t evicted,
                                    table->SetLearnerVersion(in.getVersion(), &ticket));
            capnp::MallocMessageBuilder builder;
            auto reply = builder.initRoot<schema::ReplayReply>();
            reply.setId(id);
            reply.setSetLearnerVersion(static_cast<uint64_t>(evicted));
            SendWhenDurable(peer, id, ticket, capnp::messageToFlatArray(builder));
            return Status::OK();
          }
          case schema::ReplayRequest::ACKNOWLEDGE: {
            auto in = req.getAcknowledge();
            ORRERY_ASSIGN_OR_RETURN(Table * table, store_->Find(in.getTable()));
            if (in.getClaimant().size() == 0) {
              return InvalidArgumentError("replay acknowledge: empty claimant");
            }
            uint64_t ticket = 0;
            ORRERY_ASSIGN_OR_RETURN(
                int64_t deleted,
                table->Acknowledge(in.getClaimant(), in.getThroughStep(), &ticket));
            capnp::MallocMessageBuilder builder;
            auto reply = builder.initRoot<schema::ReplayReply>();
            reply.setId(id);
            reply.setAcknowledge(static_cast<uint64_t>(deleted));
            SendWhenDurable(peer, id, ticket, capnp::messageToFlatArray(builder));
            return Status::OK();
          }
          default:
            return InvalidArgumentError("replay request: unknown request kind " +
                                        std::to_string(static_cast<int>(req.which())));
        }
        park->peer = peer;
        park->id = id;
        park->deadline = deadline;
        park->start = Clock::now();
        park->start_unix = UnixSeconds();
        return Status::OK();
      });
  if (!status.ok()) {
    Reply(peer, id, status);
    return;
  }
  if (park == nullptr) return;
  // Requests to a table are served in arrival order: a new one waits behind parked ones.
  bool queued_behind = false;
  for (const auto& p : parked_) {
    if (p->table == park->table && p->is_insert == park->is_insert) queued_behind = true;
  }
  if (!queued_behind && TryParked(*park)) {
    Poll();  // the table changed: parked requests of the other kind may proceed now
    return;
  }
  if (Status limit = CheckParkLimits(*park); !limit.ok()) {
    Reply(peer, id, limit);
    return;
  }
  Count(*park, +1);
  parked_.push_back(std::move(park));
  Poll();
}

void ReplayService::Poll() {
  // Retry parked requests until none makes progress (an insert can unblock a sample and back).
  bool progress = true;
  while (progress && !parked_.empty()) {
    progress = false;
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (TryParked(**it)) {
        Count(**it, -1);
        it = parked_.erase(it);
        progress = true;
      } else {
        ++it;
      }
    }
  }
  const auto now = Clock::now();
  for (auto it = parked_.begin(); it != parked_.end();) {
    Parked& p = **it;
    if (p.deadline <= now) {
      p.table->RecordBlocked(p.is_insert ? BlockedOp::kInsert : BlockedOp::kSample, p.start_unix,
                             std::chrono::duration<double>(now - p.start).count());
      Reply(p.peer, p.id,
            DeadlineExceededError(
                "replay table '" + p.table->name() + "': " +
                (p.is_insert ? "insert blocked by the rate limiter" : "nothing could be sampled") +
                " until the deadline"));
      Count(p, -1);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  const uint64_t durable = store_->storage()->durable_ticket();
  // After a failed write or WAL sync nothing later becomes durable: those replies get the error.
  const Status failed = pending_.empty() ? Status::OK() : store_->storage()->error();
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->ticket <= durable) {
      send_(it->peer, std::move(it->reply));
    } else if (!failed.ok()) {
      Reply(it->peer, it->id, failed);
    } else {
      ++it;
      continue;
    }
    it = pending_.erase(it);
  }
  for (auto it = checkpoints_.begin(); it != checkpoints_.end();) {
    PendingCheckpoint& c = **it;
    if (c.result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      ++it;
      continue;
    }
    StatusOr<std::string> dir = c.result.get();
    if (!dir.ok()) {
      Reply(c.peer, c.id, dir.status());
    } else {
      capnp::MallocMessageBuilder builder;
      auto reply = builder.initRoot<schema::ReplayReply>();
      reply.setId(c.id);
      reply.setCheckpoint(*dir);
      send_(c.peer, capnp::messageToFlatArray(builder));
    }
    it = checkpoints_.erase(it);
  }
}

int64_t ReplayService::PollIntervalMs() const {
  if (!pending_.empty() || !checkpoints_.empty()) return 1;
  if (parked_.empty()) return -1;
  Deadline earliest = Deadline::max();
  for (const auto& p : parked_) earliest = std::min(earliest, p->deadline);
  if (earliest == Deadline::max()) return -1;
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(earliest - Clock::now()).count();
  return std::max<int64_t>(0, ms + 1);
}

void ReplayService::CancelAll() {
  for (auto& p : parked_) Reply(p->peer, p->id, CancelledError("replay: the store is stopping"));
  parked_.clear();
  parked_by_table_.clear();
  parked_by_peer_.clear();
  for (auto& c : checkpoints_) c->result.wait();
  Poll();
}

}  // namespace orrery::replay
