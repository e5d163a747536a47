// The replay store's RocksDB layout and record encodings (Cap'n Proto structs of
// actors/schema/replay.capnp, so records can gain fields without breaking old databases).
//
//   t/<table>              StoredTable: limiter counters, learner version, next key, RNG offset
//   i/<table>/<key:be64>   StoredItem: priority, times sampled, tokens, policy version, tiebreak
//   d/<table>/<key:be64>   StoredPayload: the item's trajectories (rewritten never; deleted with
//                          i/)
//   b/<table>/<n:be64>     BatchRecord: which keys went into learner batch n, at which version
//   k/<table>/<seq:be64>   IdempotencyRecord: the outcome of the seq-th insert with an
//                          idempotency key (the last idempotency_window of them are kept)
//   c/<table>/<key:be64>   ClaimRecord: item <key> was sampled by a claimant and is kept until
//                          that claimant acknowledges the batch step (then deleted with i/, d/)
//
// Table names are [A-Za-z0-9_.-]+, so '/' separates fields unambiguously and big-endian keys
// iterate in key order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace rocksdb {
class WriteBatch;
}  // namespace rocksdb

namespace orrery::replay {

std::string TableRecordKey(std::string_view table);
std::string ItemRecordPrefix(std::string_view table);
std::string ItemRecordKey(std::string_view table, uint64_t key);
std::string PayloadRecordPrefix(std::string_view table);
std::string PayloadRecordKey(std::string_view table, uint64_t key);
std::string BatchRecordPrefix(std::string_view table);
std::string BatchRecordKey(std::string_view table, uint64_t n);
std::string IdempotencyRecordPrefix(std::string_view table);
std::string IdempotencyRecordKey(std::string_view table, uint64_t seq);
std::string ClaimRecordPrefix(std::string_view table);
std::string ClaimRecordKey(std::string_view table, uint64_t key);
// The trailing big-endian number of an item, payload or batch key.
StatusOr<uint64_t> RecordKeyNumber(std::string_view record_key);

struct TableState {
  int64_t inserts = 0, samples = 0, deletes = 0;
  int64_t stale_evicted = 0;
  double forgiven_samples = 0;  // RateLimiterCounters::forgiven
  int64_t learner_version = 0;
  uint64_t next_key = 1;
  uint64_t next_tiebreak = 1;
  uint64_t rng_offset = 0;
  int64_t batches_logged = 0;
  uint64_t next_idempotency_seq = 1;
};

struct ItemState {
  uint64_t group_id = 0;
  double priority = 0;
  uint32_t times_sampled = 0;
  int64_t tokens = 0;
  int64_t min_policy_version = 0;
  uint64_t tiebreak = 0;
  double inserted_unix_seconds = 0;
};

struct BatchLogEntry {
  int64_t step = 0;
  int64_t learner_version = 0;
  double unix_seconds = 0;
  std::vector<uint64_t> keys;
};

struct IdempotencyRecord {
  std::string idempotency_key;
  uint64_t group_id = 0;
  uint64_t key = 0;  // the item's key; 0 when it was dropped as stale
  bool dropped_stale = false;
};

struct ClaimRecord {
  std::string claimant;
  uint64_t session = 0;  // the claimant's incarnation that holds the claim
  int64_t step = 0;      // the batch step it was sampled for
};

std::string EncodeTableState(const TableState& state);
StatusOr<TableState> DecodeTableState(std::string_view bytes);
std::string EncodeItemState(const ItemState& state);
StatusOr<ItemState> DecodeItemState(std::string_view bytes);
// Adds the StoredPayload record of `trajectories` under `key` to `batch` (flat Cap'n Proto
// encoding, read back by DecodePayload). The bytes are copied twice (into the message, into the
// batch), not four times through intermediate flat arrays and strings.
void PutPayload(rocksdb::WriteBatch* batch, std::string_view key,
                const std::vector<std::string>& trajectories);
StatusOr<std::vector<std::string>> DecodePayload(std::string_view bytes);
std::string EncodeIdempotencyRecord(const IdempotencyRecord& record);
StatusOr<IdempotencyRecord> DecodeIdempotencyRecord(std::string_view bytes);
std::string EncodeClaimRecord(const ClaimRecord& record);
StatusOr<ClaimRecord> DecodeClaimRecord(std::string_view bytes);
std::string EncodeBatchLogEntry(const BatchLogEntry& entry);
StatusOr<BatchLogEntry> DecodeBatchLogEntry(std::string_view bytes);

// Validates a table name: 1-128 characters of [A-Za-z0-9_.-].
Status ValidateTableName(std::string_view name);

}  // namespace orrery::replay
