#include "actors/replay/records.h"

#include <rocksdb/write_batch.h>

#include <bit>

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

std::string IdempotencyRecordPrefix(std::string_view table) { return Prefix('k', table); }
std::string IdempotencyRecordKey(std::string_view table, uint64_t seq) {
  return NumberedKey('k', table, seq);
}

std::string ClaimRecordPrefix(std::string_view table) { return Prefix('c', table); }
std::string ClaimRecordKey(std::string_view table, uint64_t key) {
  return NumberedKey('c', table, key);
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
  r.setForgivenSamples(s.forgiven_samples);
  r.setLearnerVersion(s.learner_version);
  r.setNextKey(s.next_key);
  r.setNextTiebreak(s.next_tiebreak);
  r.setRngOffset(s.rng_offset);
  r.setBatchesLogged(s.batches_logged);
  r.setNextIdempotencySeq(s.next_idempotency_seq);
  return CapnpToBytes(builder);
}

StatusOr<TableState> DecodeTableState(std::string_view bytes) {
  TableState s;
  Status st = ReadCapnpMessage<schema::StoredTable>(bytes, "stored table", [&](auto r) {
    s.inserts = r.getInserts();
    s.samples = r.getSamples();
    s.deletes = r.getDeletes();
    s.stale_evicted = r.getStaleEvicted();
    s.forgiven_samples = r.getForgivenSamples();
    s.learner_version = r.getLearnerVersion();
    s.next_key = r.getNextKey();
    s.next_tiebreak = r.getNextTiebreak();
    s.rng_offset = r.getRngOffset();
    s.batches_logged = r.getBatchesLogged();
    s.next_idempotency_seq = r.getNextIdempotencySeq();
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

void PutPayload(rocksdb::WriteBatch* batch, std::string_view key,
                const std::vector<std::string>& trajectories) {
  // A first segment sized for the whole payload (root, list pointers, data rounded to words), so
  // the message is one segment; were it not, the framing below still handles every segment.
  size_t words = 16 + 2 * trajectories.size();
  for (const std::string& t : trajectories) words += (t.size() + 7) / 8;
  capnp::MallocMessageBuilder builder(static_cast<unsigned>(words),
                                      capnp::AllocationStrategy::FIXED_SIZE);
  auto list = builder.initRoot<schema::StoredPayload>().initTrajectories(
      static_cast<unsigned>(trajectories.size()));
  for (size_t i = 0; i < trajectories.size(); ++i) {
    list.set(static_cast<unsigned>(i),
             capnp::Data::Reader(reinterpret_cast<const kj::byte*>(trajectories[i].data()),
                                 trajectories[i].size()));
  }
  // Cap'n Proto's flat framing: u32 (segment count - 1), u32 size in words of each segment,
  // padded to a whole word, then the segments.
  static_assert(std::endian::native == std::endian::little, "the framing is little endian");
  auto segments = builder.getSegmentsForOutput();
  std::vector<uint32_t> table((segments.size() + 2) / 2 * 2, 0);
  table[0] = static_cast<uint32_t>(segments.size() - 1);
  std::vector<rocksdb::Slice> parts;
  parts.emplace_back(reinterpret_cast<const char*>(table.data()), table.size() * sizeof(uint32_t));
  for (size_t i = 0; i < segments.size(); ++i) {
    table[i + 1] = static_cast<uint32_t>(segments[i].size());
    const auto bytes = segments[i].asBytes();
    parts.emplace_back(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  }
  const rocksdb::Slice key_slice(key.data(), key.size());
  batch->Put(rocksdb::SliceParts(&key_slice, 1),
             rocksdb::SliceParts(parts.data(), static_cast<int>(parts.size())));
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

std::string EncodeIdempotencyRecord(const IdempotencyRecord& rec) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<schema::IdempotencyRecord>();
  r.setIdempotencyKey(capnp::Data::Reader(
      reinterpret_cast<const kj::byte*>(rec.idempotency_key.data()), rec.idempotency_key.size()));
  r.setGroupId(rec.group_id);
  r.setKey(rec.key);
  r.setDroppedStale(rec.dropped_stale);
  return CapnpToBytes(builder);
}

StatusOr<IdempotencyRecord> DecodeIdempotencyRecord(std::string_view bytes) {
  IdempotencyRecord rec;
  Status st = ReadCapnpMessage<schema::IdempotencyRecord>(bytes, "idempotency record", [&](auto r) {
    auto k = r.getIdempotencyKey();
    rec.idempotency_key.assign(reinterpret_cast<const char*>(k.begin()), k.size());
    rec.group_id = r.getGroupId();
    rec.key = r.getKey();
    rec.dropped_stale = r.getDroppedStale();
    return Status::OK();
  });
  if (!st.ok()) return DataLossError(st.message());
  return rec;
}

std::string EncodeClaimRecord(const ClaimRecord& rec) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<schema::ClaimRecord>();
  r.setClaimant(rec.claimant);
  r.setSession(rec.session);
  r.setStep(rec.step);
  return CapnpToBytes(builder);
}

StatusOr<ClaimRecord> DecodeClaimRecord(std::string_view bytes) {
  ClaimRecord rec;
  Status st = ReadCapnpMessage<schema::ClaimRecord>(bytes, "claim record", [&](auto r) {
    rec.claimant = r.getClaimant();
    rec.session = r.getSession();
    rec.step = r.getStep();
    return Status::OK();
  });
  if (!st.ok()) return DataLossError(st.message());
  return rec;
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
