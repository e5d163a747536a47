# The replay store's wire protocol (client DEALER <-> actor ROUTER, one message per frame) and the
# records it keeps in RocksDB. See docs/replay.md.
@0xfd651635c9b06e2b;

$import "/capnp/c++.capnp".namespace("orrery::schema");

struct ReplayRequest {
  id @0 :UInt64;          # echoed in the reply; chosen by the client
  timeoutMs @1 :Int64;    # how long a blocking call may wait: < 0 forever, 0 not at all
  union {
    insert @2 :InsertRequest;
    sample @3 :SampleRequest;
    updatePriorities @4 :UpdatePrioritiesRequest;
    info @5 :Void;
    checkpoint @6 :CheckpointRequest;
    setLearnerVersion @7 :SetLearnerVersionRequest;
    acknowledge @8 :AcknowledgeRequest;
  }
}

# One item: a group of trajectories that is inserted, sampled and evicted as a unit.
struct InsertRequest {
  table @0 :Text;
  groupId @1 :UInt64;
  priority @2 :Float64;
  tokens @3 :Int64;            # model tokens of the group (rate limiter in token mode)
  minPolicyVersion @4 :Int64;  # oldest policy version of any token (staleness window)
  trajectories @5 :List(Data); # packed Trajectory messages (or any bytes)
  idempotencyKey @6 :Data;     # non-empty: a retry with the same key gets the first reply
}

struct SampleRequest {
  table @0 :Text;
  maxItems @1 :UInt32;         # returns between 1 and maxItems items
  learnerVersion @2 :Int64;    # >= 0: advance the table's learner version first
  batchStep @3 :Int64;         # >= 0: log the sampled keys as the learner batch of this step
  claimant @4 :Text;           # non-empty (needs batchStep >= 0): items this sample would delete
                               # are claimed instead, and deleted by a later AcknowledgeRequest
  claimSession @5 :UInt64;     # the claimant's incarnation: claims of another one are redelivered
}

# Deletes the items `claimant` claimed for batch steps <= throughStep (its batch log is safe).
struct AcknowledgeRequest {
  table @0 :Text;
  claimant @1 :Text;
  throughStep @2 :Int64;
}

struct UpdatePrioritiesRequest {
  table @0 :Text;
  keys @1 :List(UInt64);
  priorities @2 :List(Float64);
  deleteKeys @3 :List(UInt64);
}

struct CheckpointRequest {
  directory @0 :Text;  # empty: a new directory under the store's checkpoint root
}

struct SetLearnerVersionRequest {
  table @0 :Text;
  version @1 :Int64;
}

struct ReplayReply {
  id @0 :UInt64;
  union {
    error @1 :Error;
    insert @2 :InsertReply;
    sample @3 :List(SampledItem);
    updatePriorities @4 :UpdatePrioritiesReply;
    info @5 :List(TableInfo);
    checkpoint @6 :Text;       # the checkpoint directory
    setLearnerVersion @7 :UInt64;  # items evicted as stale
    acknowledge @8 :UInt64;        # claimed items deleted
  }
}

struct Error {
  code @0 :UInt16;   # orrery::StatusCode
  message @1 :Text;
}

struct InsertReply {
  key @0 :UInt64;          # 0 when the item was already stale and was dropped
  droppedStale @1 :Bool;
  duplicate @2 :Bool;      # answered from an earlier insert with the same idempotency key
}

struct UpdatePrioritiesReply {
  updated @0 :UInt32;
  deleted @1 :UInt32;
  missing @2 :UInt32;      # keys no longer in the table (evicted meanwhile): skipped
}

struct SampledItem {
  key @0 :UInt64;
  groupId @1 :UInt64;
  priority @2 :Float64;
  probability @3 :Float64;
  timesSampled @4 :UInt32;   # including this sample
  tableSize @5 :UInt64;
  tokens @6 :Int64;
  minPolicyVersion @7 :Int64;
  trajectories @8 :List(Data);
  redelivered @9 :Bool;      # claimed by an earlier incarnation of the claimant, never acknowledged
}

struct TableInfo {
  name @0 :Text;
  sampler @1 :Text;
  remover @2 :Text;
  maxSize @3 :Int64;
  maxTimesSampled @4 :Int32;
  countUnit @5 :Text;
  samplesPerInsert @6 :Float64;
  minSizeToSample @7 :Int64;
  minDiff @8 :Float64;
  maxDiff @9 :Float64;
  maxStaleness @10 :Int64;
  size @11 :Int64;
  inserts @12 :Int64;
  samples @13 :Int64;
  deletes @14 :Int64;
  staleEvicted @15 :Int64;
  learnerVersion @16 :Int64;
  bytes @17 :Int64;
  batchesLogged @18 :Int64;
  insertBlockedCalls @19 :Int64;
  insertBlockedMsP50 @20 :Float64;
  insertBlockedMsP99 @21 :Float64;
  sampleBlockedCalls @22 :Int64;
  sampleBlockedMsP50 @23 :Float64;
  sampleBlockedMsP99 @24 :Float64;
  insertBlockedSecondsTotal @25 :Float64;
  sampleBlockedSecondsTotal @26 :Float64;
  claimed @27 :Int64;        # items claimed by a learner and not yet acknowledged
}

# --- Records kept in RocksDB (key layout in actors/replay/records.h) ---

struct StoredTable {
  inserts @0 :Int64;
  samples @1 :Int64;
  deletes @2 :Int64;
  staleEvicted @3 :Int64;
  learnerVersion @4 :Int64;
  nextKey @5 :UInt64;
  nextTiebreak @6 :UInt64;
  rngOffset @7 :UInt64;
  batchesLogged @8 :Int64;
  nextIdempotencySeq @9 :UInt64 = 1;
  forgivenSamples @10 :Float64;  # samples owed by items evicted as stale (rate_limiter.h)
}

struct StoredItem {
  groupId @0 :UInt64;
  priority @1 :Float64;
  timesSampled @2 :UInt32;
  tokens @3 :Int64;
  minPolicyVersion @4 :Int64;
  tiebreak @5 :UInt64;      # insertion/update order: heap selectors break priority ties with it
  insertedUnixSeconds @6 :Float64;
}

struct StoredPayload {
  trajectories @0 :List(Data);
}

# The outcome of an insert that carried an idempotency key (kept for the table's last
# idempotency_window keys).
struct IdempotencyRecord {
  idempotencyKey @0 :Data;
  groupId @1 :UInt64;
  key @2 :UInt64;
  droppedStale @3 :Bool;
}

# A sampled item held for its claimant until acknowledged (key c/<table>/<item key>).
struct ClaimRecord {
  claimant @0 :Text;
  session @1 :UInt64;
  step @2 :Int64;
}

struct BatchRecord {
  step @0 :Int64;
  learnerVersion @1 :Int64;
  unixSeconds @2 :Float64;
  keys @3 :List(UInt64);
}
