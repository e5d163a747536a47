#include "actors/replay/client.h"

#include <capnp/message.h>

#include <chrono>

#include "actors/replay/capnp_io.h"
#include "actors/replay/wire.h"
#include "actors/runtime/fleet_curve.h"
#include "core/message_limits.h"

namespace orrery::replay {
namespace {

kj::ArrayPtr<const kj::byte> Bytes(const std::string& s) {
  return kj::ArrayPtr<const kj::byte>(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

}  // namespace

ReplayClient::ReplayClient(std::unique_ptr<zmq::context_t> owned, zmq::context_t* context,
                           ReplayClientOptions options)
    : owned_context_(std::move(owned)),
      context_(context),
      socket_(*context, zmq::socket_type::dealer),
      options_(options) {}

ReplayClient::~ReplayClient() = default;

StatusOr<std::unique_ptr<ReplayClient>> ReplayClient::Connect(const std::string& endpoint,
                                                              zmq::context_t* context,
                                                              ReplayClientOptions options) {
  std::unique_ptr<zmq::context_t> owned;
  if (context == nullptr) {
    owned = std::make_unique<zmq::context_t>(1);
    context = owned.get();
  }
  std::unique_ptr<ReplayClient> client(new ReplayClient(std::move(owned), context, options));
  client->socket_.set(zmq::sockopt::linger, 0);
  client->socket_.set(zmq::sockopt::maxmsgsize, MaxMessageBytes());
  // A DEALER without a connection blocks in send (after a refused CURVE handshake libzmq keeps
  // none): give up after the grace instead of hanging.
  client->socket_.set(zmq::sockopt::sndtimeo,
                      static_cast<int>(std::min<int64_t>(options.reply_grace_ms, 1 << 30)));
  try {
    SecureFleetSocket(*client->context_, client->socket_, endpoint, SocketSide::kConnect);
    client->socket_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return InvalidArgumentError("replay client: cannot connect to '" + endpoint + "': " + e.what());
  }
  client->endpoint_ = endpoint;
  return client;
}

Status ReplayClient::NotConnected() const {
  return UnavailableError("replay client: no connection to " + endpoint_ + " within " +
                          std::to_string(options_.reply_grace_ms) +
                          " ms (is the store up? on tcp: does this process hold the fleet's CURVE "
                          "keys?)");
}

StatusOr<std::string> ReplayClient::CallRaw(const std::string& bytes, int64_t wait_ms) {
  try {
    if (!socket_.send(zmq::buffer(bytes), zmq::send_flags::none)) return NotConnected();
    zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(wait_ms));
    if (!(item.revents & ZMQ_POLLIN)) {
      return UnavailableError("replay client: no reply from " + endpoint_ + " within " +
                              std::to_string(wait_ms) + " ms");
    }
    zmq::message_t reply;
    (void)socket_.recv(reply, zmq::recv_flags::none);
    return reply.to_string();
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("replay client: ") + e.what());
  }
}

StatusOr<std::string> ReplayClient::Call(const std::string& request, uint64_t id,
                                         int64_t timeout_ms) {
  const bool forever = timeout_ms < 0;
  const auto give_up =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0) + options_.reply_grace_ms);
  try {
    if (!socket_.send(zmq::buffer(request), zmq::send_flags::none)) return NotConnected();
    while (true) {
      int64_t wait = 100;
      if (!forever) {
        wait = std::chrono::duration_cast<std::chrono::milliseconds>(
                   give_up - std::chrono::steady_clock::now())
                   .count();
        if (wait <= 0) {
          return UnavailableError("replay client: no reply from " + endpoint_ + " within " +
                                  std::to_string(timeout_ms + options_.reply_grace_ms) + " ms");
        }
      }
      zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(wait));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t reply;
      (void)socket_.recv(reply, zmq::recv_flags::none);
      std::string bytes = reply.to_string();
      uint64_t reply_id = 0;
      Status s = ReadCapnpMessage<schema::ReplayReply>(bytes, "replay reply", [&](auto r) {
        reply_id = r.getId();
        return Status::OK();
      });
      ORRERY_RETURN_IF_ERROR(s);
      if (reply_id == id || reply_id == 0) return bytes;  // 0: the store could not read the id
      // A late reply to an earlier call that timed out here: skip it.
    }
  } catch (const zmq::error_t& e) {
    return UnavailableError(std::string("replay client: ") + e.what());
  }
}

// Builds a request, calls, and hands the reply root to `fn` (error replies become the Status).
#define ORRERY_REPLAY_CALL(timeout_ms, fill, on_reply)                                           \
  capnp::MallocMessageBuilder builder;                                                           \
  auto req = builder.initRoot<schema::ReplayRequest>();                                          \
  const uint64_t id = next_id_++;                                                                \
  req.setId(id);                                                                                 \
  req.setTimeoutMs(timeout_ms);                                                                  \
  fill;                                                                                          \
  ORRERY_ASSIGN_OR_RETURN(std::string reply_bytes, Call(CapnpToBytes(builder), id, timeout_ms)); \
  Status reply_status = ReadCapnpMessage<schema::ReplayReply>(                                   \
      reply_bytes, "replay reply", [&](schema::ReplayReply::Reader reply) -> Status {            \
        if (reply.isError()) return ReadError(reply.getError());                                 \
        on_reply;                                                                                \
        return Status::OK();                                                                     \
      });                                                                                        \
  ORRERY_RETURN_IF_ERROR(reply_status)

StatusOr<InsertReply> ReplayClient::Insert(const std::string& table, const ItemInput& item,
                                           int64_t timeout_ms) {
  InsertReply out;
  ORRERY_REPLAY_CALL(
      timeout_ms,
      {
        auto in = req.initInsert();
        in.setTable(table);
        in.setGroupId(item.group_id);
        in.setPriority(item.priority);
        in.setTokens(item.tokens);
        in.setMinPolicyVersion(item.min_policy_version);
        in.setIdempotencyKey(Bytes(item.idempotency_key));
        auto list = in.initTrajectories(static_cast<unsigned>(item.trajectories.size()));
        for (size_t i = 0; i < item.trajectories.size(); ++i) {
          // Orphan-free zero-copy is not possible for Data in a builder: the bytes are copied
          // once into the message.
          list.set(static_cast<unsigned>(i), Bytes(item.trajectories[i]));
        }
      },
      {
        if (!reply.isInsert()) return InternalError("replay client: unexpected reply to insert");
        out.key = reply.getInsert().getKey();
        out.dropped_stale = reply.getInsert().getDroppedStale();
        out.duplicate = reply.getInsert().getDuplicate();
      });
  return out;
}

StatusOr<std::vector<SampledItem>> ReplayClient::Sample(const std::string& table,
                                                        const SampleOptions& options,
                                                        int64_t timeout_ms) {
  std::vector<SampledItem> out;
  ORRERY_REPLAY_CALL(
      timeout_ms,
      {
        auto in = req.initSample();
        in.setTable(table);
        in.setMaxItems(static_cast<uint32_t>(std::max(options.max_items, 0)));
        in.setLearnerVersion(options.learner_version);
        in.setBatchStep(options.batch_step);
        in.setClaimant(options.claimant);
        in.setClaimSession(options.claim_session);
      },
      {
        if (!reply.isSample()) return InternalError("replay client: unexpected reply to sample");
        for (auto item : reply.getSample()) out.push_back(ReadSampledItem(item));
      });
  return out;
}

StatusOr<UpdateOutcome> ReplayClient::UpdatePriorities(
    const std::string& table, const std::vector<std::pair<uint64_t, double>>& updates,
    const std::vector<uint64_t>& deletes) {
  UpdateOutcome out;
  ORRERY_REPLAY_CALL(
      0,
      {
        auto in = req.initUpdatePriorities();
        in.setTable(table);
        auto keys = in.initKeys(static_cast<unsigned>(updates.size()));
        auto prios = in.initPriorities(static_cast<unsigned>(updates.size()));
        for (size_t i = 0; i < updates.size(); ++i) {
          keys.set(static_cast<unsigned>(i), updates[i].first);
          prios.set(static_cast<unsigned>(i), updates[i].second);
        }
        auto del = in.initDeleteKeys(static_cast<unsigned>(deletes.size()));
        for (size_t i = 0; i < deletes.size(); ++i) del.set(static_cast<unsigned>(i), deletes[i]);
      },
      {
        if (!reply.isUpdatePriorities()) {
          return InternalError("replay client: unexpected reply to update");
        }
        out.updated = reply.getUpdatePriorities().getUpdated();
        out.deleted = reply.getUpdatePriorities().getDeleted();
        out.missing = reply.getUpdatePriorities().getMissing();
      });
  return out;
}

StatusOr<int64_t> ReplayClient::SetLearnerVersion(const std::string& table, int64_t version) {
  int64_t evicted = 0;
  ORRERY_REPLAY_CALL(
      0,
      {
        auto in = req.initSetLearnerVersion();
        in.setTable(table);
        in.setVersion(version);
      },
      {
        if (!reply.isSetLearnerVersion()) {
          return InternalError("replay client: unexpected reply to set-learner-version");
        }
        evicted = static_cast<int64_t>(reply.getSetLearnerVersion());
      });
  return evicted;
}

StatusOr<int64_t> ReplayClient::Acknowledge(const std::string& table, const std::string& claimant,
                                            int64_t through_step) {
  int64_t deleted = 0;
  ORRERY_REPLAY_CALL(
      0,
      {
        auto in = req.initAcknowledge();
        in.setTable(table);
        in.setClaimant(claimant);
        in.setThroughStep(through_step);
      },
      {
        if (!reply.isAcknowledge()) {
          return InternalError("replay client: unexpected reply to acknowledge");
        }
        deleted = static_cast<int64_t>(reply.getAcknowledge());
      });
  return deleted;
}

StatusOr<std::vector<TableInfo>> ReplayClient::Info() {
  std::vector<TableInfo> out;
  ORRERY_REPLAY_CALL(0, req.setInfo(), {
    if (!reply.isInfo()) return InternalError("replay client: unexpected reply to info");
    for (auto t : reply.getInfo()) out.push_back(ReadTableInfo(t));
  });
  return out;
}

StatusOr<std::string> ReplayClient::Checkpoint(const std::string& directory) {
  std::string out;
  // A checkpoint hard-links files and copies the WAL: allow it a minute.
  ORRERY_REPLAY_CALL(60000, req.initCheckpoint().setDirectory(directory), {
    if (!reply.isCheckpoint())
      return InternalError("replay client: unexpected reply to checkpoint");
    out = reply.getCheckpoint();
  });
  return out;
}

#undef ORRERY_REPLAY_CALL

}  // namespace orrery::replay
