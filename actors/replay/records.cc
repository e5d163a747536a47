#include "actors/replay/records.h"

#include "actors/replay/capnp_io.h"
#include "actors/schema/replay.capnp.h"

namespace orrery::replay {
namespace {

void AppendBigEndian(std::string* out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

std::string Prefix(char kind, std::string_view table) {
  std::string out;
  out.reserve(table.size() + 3);
  out.push_back(kind);
  out.push_back('/');
  out.append(table);
  out.push_back('/');
  return out;
}

std::string NumberedKey(char kind, std::string_view table, uint64_t n) {
  std::string out = Prefix(kind, table);
  AppendBigEndian(&out, n);
  return out;
}

}  // namespace

std::string TableRecordKey(std::string_view table) {
  std::string out = "t/";
  out.append(table);
  return out;
}
std::string ItemRecordPrefix(std::string_view table) { return Prefix('i', table); }
std::string ItemRecordKey(std::string_view table, uint64_t key) {
  return NumberedKey('i', table, key);
}
std::string PayloadRecordPrefix(std::string_view table) { return Prefix('d', table); }
std::string PayloadRecordKey(std::string_view table, uint64_t key) {
  return NumberedKey('d', table, key);
}
std::string BatchRecordPrefix(std::string_view table) { return Prefix('b', table); }
std::string BatchRecordKey(std::string_view table, uint64_t n) {
  return NumberedKey('b', table, n);
}

StatusOr<uint64_t> RecordKeyNumber(std::string_view record_key) {
  if (record_key.size() < 8) return DataLossError("replay record key too short");
  uint64_t v = 0;
  for (size_t i = record_key.size() - 8; i < record_key.size(); ++i) {
    v = (v << 8) | static_cast<uint8_t>(record_key[i]);
  }
  return v;
}

std::string EncodeTableState(const TableState& s) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<schema::StoredTable>();
  r.setInserts(s.inserts);
  r.setSamples(s.samples);
  r.setDeletes(s.deletes);
  r.setStaleEvicted(s.stale_evicted);
  r.setLearnerVersion(s.learner_version);
  r.setNextKey(s.next_key);
  r.setNextTiebreak(s.next_tiebreak);
  r.setRngOffset(s.rng_offset);
  r.setBatchesLogged(s.batches_logged);
  return CapnpToBytes(builder);
}

StatusOr<TableState> DecodeTableState(std::string_view bytes) {
  TableState s;
  Status st = ReadCapnpMessage<schema::StoredTable>(bytes, "stored table", [&](auto r) {
    s.inserts = r.getInserts();
    s.samples = r.getSamples();
    s.deletes = r.getDeletes();
    s.stale_evicted = r.getStaleEvicted();
    s.learner_version = r.getLearnerVersion();
    s.next_key = r.getNextKey();
    s.next_tiebreak = r.getNextTiebreak();
    s.rng_offset = r.getRngOffset();
    s.batches_logged = r.getBatchesLogged();
    return Status::OK();
  });
  if (!st.ok()) return DataLossError(st.message());
  return s;
}

std::string EncodeItemState(const ItemState& s) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<schema::StoredItem>();
  r.setGroupId(s.group_id);
  r.setPriority(s.priority);
  r.setTimesSampled(s.times_sampled);
  r.setTokens(s.tokens);
  r.setMinPolicyVersion(s.min_policy_version);
  r.setTiebreak(s.tiebreak);
  r.setInsertedUnixSeconds(s.inserted_unix_seconds);
  return CapnpToBytes(builder);
}

StatusOr<ItemState> DecodeItemState(std::string_view bytes) {
  ItemState s;
  Status st = ReadCapnpMessage<schema::StoredItem>(bytes, "stored item", [&](auto r) {
    s.group_id = r.getGroupId();
    s.priority = r.getPriority();
    s.times_sampled = r.getTimesSampled();
    s.tokens = r.getTokens();
    s.min_policy_version = r.getMinPolicyVersion();
    s.tiebreak = r.getTiebreak();
    s.inserted_unix_seconds = r.getInsertedUnixSeconds();
    return Status::OK();
  });
  if (!st.ok()) return DataLossError(st.message());
  return s;
}

std::string EncodePayload(const std::vector<std::string>& trajectories) {
  capnp::MallocMessageBuilder builder;
  auto list = builder.initRoot<schema::StoredPayload>().initTrajectories(trajectories.size());
  for (size_t i = 0; i < trajectories.size(); ++i) {
    list.set(i, capnp::Data::Reader(reinterpret_cast<const kj::byte*>(trajectories[i].data()),
                                    trajectories[i].size()));
  }
  return CapnpToBytes(builder);
}

StatusOr<std::vector<std::string>> DecodePayload(std::string_view bytes) {
  std::vector<std::string> out;
  Status st = ReadCapnpMessage<schema::StoredPayload>(bytes, "stored payload", [&](auto r) {
    for (auto d : r.getTrajectories()) {
      out.emplace_back(reinterpret_cast<const char*>(d.begin()), d.size());
    }
    return Status::OK();
  });
  if (!st.ok()) return DataLossError(st.message());
  return out;
}

std::string EncodeBatchLogEntry(const BatchLogEntry& e) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<schema::BatchRecord>();
  r.setStep(e.step);
  r.setLearnerVersion(e.learner_version);
  r.setUnixSeconds(e.unix_seconds);
  auto keys = r.initKeys(e.keys.size());
  for (size_t i = 0; i < e.keys.size(); ++i) keys.set(i, e.keys[i]);
  return CapnpToBytes(builder);
}

StatusOr<BatchLogEntry> DecodeBatchLogEntry(std::string_view bytes) {
  BatchLogEntry e;
  Status st = ReadCapnpMessage<schema::BatchRecord>(bytes, "batch record", [&](auto r) {
    e.step = r.getStep();
    e.learner_version = r.getLearnerVersion();
    e.unix_seconds = r.getUnixSeconds();
    for (uint64_t k : r.getKeys()) e.keys.push_back(k);
    return Status::OK();
  });
  if (!st.ok()) return DataLossError(st.message());
  return e;
}

Status ValidateTableName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 128;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '.' || c == '-');
  }
  if (!ok) {
    return InvalidArgumentError("replay table name '" + std::string(name) +
                                "': expected 1-128 characters of [A-Za-z0-9_.-]");
  }
  return Status::OK();
}

}  // namespace orrery::replay
