#include "actors/replay/table.h"

#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cmath>

#include "core/logging.h"
#include "core/metrics.h"

namespace orrery::replay {
namespace {

rocksdb::Slice AsSlice(const std::string& s) { return rocksdb::Slice(s.data(), s.size()); }

}  // namespace

Deadline DeadlineFromTimeoutMs(int64_t timeout_ms) {
  if (timeout_ms < 0) return NoDeadline();
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}

Status ValidateTableOptions(const TableOptions& o) {
  ORRERY_RETURN_IF_ERROR(ValidateTableName(o.name));
  const std::string where = "replay table '" + o.name + "': ";
  if (o.max_size < 1) return InvalidArgumentError(where + "max_size must be >= 1");
  if (o.max_times_sampled < 0)
    return InvalidArgumentError(where + "max_times_sampled must be >= 0");
  if (o.max_item_bytes < 1) return InvalidArgumentError(where + "max_item_bytes must be >= 1");
  if (o.idempotency_window < 1)
    return InvalidArgumentError(where + "idempotency_window must be >= 1");
  for (const SelectorOptions* s : {&o.sampler, &o.remover}) {
    if (s->kind == SelectorKind::kPrioritized &&
        (!(s->priority_exponent >= 0) || !std::isfinite(s->priority_exponent))) {
      return InvalidArgumentError(where + "priority_exponent must be finite and >= 0");
    }
  }
  Status s = ValidateRateLimiterOptions(o.limiter);
  if (!s.ok()) return s.WithContext("replay table '" + o.name + "'");
  return Status::OK();
}

Table::Table(TableOptions options, Storage* storage)
    : options_(std::move(options)),
      storage_(storage),
      sampler_(MakeSelector(options_.sampler)),
      remover_(MakeSelector(options_.remover)),
      blocked_(options_.blocked_log_capacity),
      limiter_(options_.limiter),
      rng_(options_.seed, 0) {}

StatusOr<std::unique_ptr<Table>> Table::Open(TableOptions options, Storage* storage) {
  ORRERY_RETURN_IF_ERROR(ValidateTableOptions(options));
  std::unique_ptr<Table> table(new Table(std::move(options), storage));
  if (storage != nullptr) ORRERY_RETURN_IF_ERROR(table->Recover());
  return table;
}

Status Table::Recover() {
  const std::string& name = options_.name;
  ORRERY_ASSIGN_OR_RETURN(std::optional<std::string> meta, storage_->Get(TableRecordKey(name)));
  if (!meta) return Status::OK();  // a new table
  ORRERY_ASSIGN_OR_RETURN(state_, DecodeTableState(*meta));
  ORRERY_RETURN_IF_ERROR(storage_->ScanPrefix(
      ItemRecordPrefix(name), [&](std::string_view key, std::string_view value) -> Status {
        ORRERY_ASSIGN_OR_RETURN(uint64_t k, RecordKeyNumber(key));
        ORRERY_ASSIGN_OR_RETURN(ItemState st, DecodeItemState(value));
        items_[k].state = st;
        return Status::OK();
      }));
  size_t with_payload = 0;
  ORRERY_RETURN_IF_ERROR(storage_->ScanPrefix(
      PayloadRecordPrefix(name), [&](std::string_view key, std::string_view value) -> Status {
        ORRERY_ASSIGN_OR_RETURN(uint64_t k, RecordKeyNumber(key));
        auto it = items_.find(k);
        if (it == items_.end()) {
          return DataLossError("replay table '" + name + "': payload without item " +
                               std::to_string(k));
        }
        ORRERY_ASSIGN_OR_RETURN(std::vector<std::string> t, DecodePayload(value));
        int64_t bytes = 0;
        for (const std::string& s : t) bytes += static_cast<int64_t>(s.size());
        it->second.bytes = bytes;  // the payload itself stays on disk: samples read it back
        ++with_payload;
        return Status::OK();
      }));
  ORRERY_RETURN_IF_ERROR(storage_->ScanPrefix(
      IdempotencyRecordPrefix(name), [&](std::string_view key, std::string_view value) -> Status {
        ORRERY_ASSIGN_OR_RETURN(uint64_t seq, RecordKeyNumber(key));
        ORRERY_ASSIGN_OR_RETURN(IdempotencyRecord record, DecodeIdempotencyRecord(value));
        remembered_order_[seq] = record.idempotency_key;
        std::string idempotency_key = record.idempotency_key;
        remembered_[std::move(idempotency_key)] = {seq, std::move(record), 0};
        return Status::OK();
      }));
  std::map<uint64_t, ClaimRecord> claims;
  ORRERY_RETURN_IF_ERROR(storage_->ScanPrefix(
      ClaimRecordPrefix(name), [&](std::string_view key, std::string_view value) -> Status {
        ORRERY_ASSIGN_OR_RETURN(uint64_t k, RecordKeyNumber(key));
        if (!items_.count(k)) {
          return DataLossError("replay table '" + name + "': claim without item " +
                               std::to_string(k));
        }
        ORRERY_ASSIGN_OR_RETURN(claims[k], DecodeClaimRecord(value));
        return Status::OK();
      }));
  if (with_payload != items_.size()) {
    return DataLossError("replay table '" + name + "': " +
                         std::to_string(items_.size() - with_payload) + " items have no payload");
  }
  int64_t live_cost = 0;
  for (auto& [key, item] : items_) {
    if (key >= state_.next_key) {
      return DataLossError("replay table '" + name + "': item key " + std::to_string(key) +
                           " >= next key " + std::to_string(state_.next_key));
    }
    bytes_ += item.bytes;
    live_cost += Cost(item.state.tokens);  // claimed items count until acknowledged
    if (claims.count(key)) continue;
    ORRERY_RETURN_IF_ERROR(sampler_->Insert(key, item.state.priority, item.state.tiebreak));
    ORRERY_RETURN_IF_ERROR(remover_->Insert(key, item.state.priority, item.state.tiebreak));
    by_version_.insert({item.state.min_policy_version, key});
  }
  for (auto& [key, claim] : claims) {
    auto it = items_.find(key);
    claimed_.emplace(key, Claimed{std::move(it->second), std::move(claim)});
    items_.erase(it);
  }
  limiter_.set_counters({state_.inserts, state_.samples, state_.deletes, state_.forgiven_samples});
  rng_.set_offset(state_.rng_offset);
  if (state_.inserts - state_.deletes != live_cost) {
    return DataLossError("replay table '" + name + "': counters say " +
                         std::to_string(state_.inserts - state_.deletes) + " live but " +
                         std::to_string(live_cost) + " are stored");
  }
  ORRERY_LOG(INFO) << "replay: recovered table " << name << " with " << items_.size() << " items, "
                   << claimed_.size() << " claimed (inserts " << state_.inserts << ", samples "
                   << state_.samples << ", deletes " << state_.deletes << ")";
  return Status::OK();
}

Status Table::CheckUsable() const {
  if (!broken_.ok()) {
    return FailedPreconditionError("replay table '" + options_.name +
                                   "' is unusable after a storage error (" + broken_.message() +
                                   "); restart the store to recover from disk");
  }
  return Status::OK();
}

Status Table::ValidateInput(const ItemInput& item) const {
  const std::string where = "replay table '" + options_.name + "': ";
  if (item.trajectories.empty())
    return InvalidArgumentError(where + "an item needs >= 1 trajectory");
  if (!(item.priority >= 0) || !std::isfinite(item.priority)) {
    return InvalidArgumentError(where + "priority must be finite and >= 0, got " +
                                std::to_string(item.priority));
  }
  if (item.tokens < 0) return InvalidArgumentError(where + "tokens must be >= 0");
  if (item.idempotency_key.size() > 1024) {
    return InvalidArgumentError(where + "an idempotency key has at most 1024 bytes, got " +
                                std::to_string(item.idempotency_key.size()));
  }
  if (options_.count_unit == CountUnit::kTokens && item.tokens < 1) {
    return InvalidArgumentError(where + "the table counts tokens: an item needs tokens >= 1");
  }
  int64_t bytes = 0;
  for (const std::string& t : item.trajectories) bytes += static_cast<int64_t>(t.size());
  if (bytes > options_.max_item_bytes) {
    return ResourceExhaustedError(where + "item of " + std::to_string(bytes) +
                                  " bytes exceeds max_item_bytes " +
                                  std::to_string(options_.max_item_bytes));
  }
  return Status::OK();
}

void Table::PutTableState(rocksdb::WriteBatch* batch) {
  const RateLimiterCounters& c = limiter_.counters();
  state_.inserts = c.inserts;
  state_.samples = c.samples;
  state_.deletes = c.deletes;
  state_.forgiven_samples = c.forgiven;
  state_.rng_offset = rng_.offset();
  batch->Put(AsSlice(TableRecordKey(options_.name)), AsSlice(EncodeTableState(state_)));
}

void Table::RememberLocked(const ItemInput& item, const InsertOutcome& out,
                           rocksdb::WriteBatch* batch) {
  if (item.idempotency_key.empty()) return;
  Remembered r;
  r.seq = state_.next_idempotency_seq++;
  r.record.idempotency_key = item.idempotency_key;
  r.record.group_id = item.group_id;
  r.record.key = out.key;
  r.record.dropped_stale = out.dropped_stale;
  batch->Put(AsSlice(IdempotencyRecordKey(options_.name, r.seq)),
             AsSlice(EncodeIdempotencyRecord(r.record)));
  remembered_order_[r.seq] = item.idempotency_key;
  remembered_[item.idempotency_key] = std::move(r);
  while (static_cast<int64_t>(remembered_.size()) > options_.idempotency_window) {
    auto oldest = remembered_order_.begin();
    batch->Delete(AsSlice(IdempotencyRecordKey(options_.name, oldest->first)));
    remembered_.erase(oldest->second);
    remembered_order_.erase(oldest);
  }
}

StatusOr<InsertOutcome> Table::CommitInsert(const ItemInput& item, InsertOutcome out,
                                            rocksdb::WriteBatch* batch) {
  RememberLocked(item, out, batch);
  ORRERY_ASSIGN_OR_RETURN(out.ticket, Commit(batch));
  if (!item.idempotency_key.empty()) remembered_.at(item.idempotency_key).ticket = out.ticket;
  return out;
}

StatusOr<uint64_t> Table::Commit(rocksdb::WriteBatch* batch) {
  PutTableState(batch);
  if (storage_ == nullptr) return uint64_t{0};
  StatusOr<uint64_t> ticket = storage_->Write(batch);
  if (!ticket.ok()) {
    broken_ = ticket.status();
    ORRERY_LOG(ERROR) << "replay table " << options_.name << ": " << broken_.message();
    cv_.notify_all();
    return ticket.status();
  }
  return ticket;
}

void Table::DeleteLocked(uint64_t key, rocksdb::WriteBatch* batch) {
  auto it = items_.find(key);
  if (it == items_.end()) return;
  (void)sampler_->Delete(key);  // present: the key is in items_
  (void)remover_->Delete(key);
  by_version_.erase({it->second.state.min_policy_version, key});
  limiter_.RecordDelete(Cost(it->second.state.tokens));
  bytes_ -= it->second.bytes;
  items_.erase(it);
  batch->Delete(AsSlice(ItemRecordKey(options_.name, key)));
  batch->Delete(AsSlice(PayloadRecordKey(options_.name, key)));
}

StatusOr<std::shared_ptr<const std::vector<std::string>>> Table::PayloadLocked(uint64_t key,
                                                                               const Item& item) {
  if (item.trajectories != nullptr) return item.trajectories;
  StatusOr<std::optional<std::string>> stored = storage_->Get(PayloadRecordKey(options_.name, key));
  Status s = stored.status();
  if (s.ok() && !stored->has_value()) {
    s = DataLossError("replay table '" + options_.name + "': the payload of item " +
                      std::to_string(key) + " is missing from the database");
  }
  if (s.ok()) {
    StatusOr<std::vector<std::string>> decoded = DecodePayload(**stored);
    if (decoded.ok()) {
      return std::make_shared<const std::vector<std::string>>(std::move(*decoded));
    }
    s = decoded.status();
  }
  // This sample may already have changed the table in memory: nothing more is served.
  broken_ = s;
  ORRERY_LOG(ERROR) << "replay table " << options_.name << ": " << s.message();
  return s;
}

void Table::ClaimLocked(uint64_t key, ClaimRecord claim, rocksdb::WriteBatch* batch) {
  auto it = items_.find(key);
  if (it == items_.end()) return;
  (void)sampler_->Delete(key);  // present: the key is in items_
  (void)remover_->Delete(key);
  by_version_.erase({it->second.state.min_policy_version, key});
  batch->Put(AsSlice(ItemRecordKey(options_.name, key)),
             AsSlice(EncodeItemState(it->second.state)));
  batch->Put(AsSlice(ClaimRecordKey(options_.name, key)), AsSlice(EncodeClaimRecord(claim)));
  claimed_.emplace(key, Claimed{std::move(it->second), std::move(claim)});
  items_.erase(it);
}

int64_t Table::EvictStaleLocked(rocksdb::WriteBatch* batch) {
  int64_t evicted = 0;
  const double spi = options_.limiter.samples_per_insert;
  while (!by_version_.empty() && IsStale(by_version_.begin()->first)) {
    const uint64_t key = by_version_.begin()->second;
    const ItemState& state = items_.at(key).state;
    const double owed = spi - static_cast<double>(state.times_sampled);
    if (owed > 0) limiter_.RecordForgiven(owed * static_cast<double>(Cost(state.tokens)));
    DeleteLocked(key, batch);
    ++evicted;
  }
  state_.stale_evicted += evicted;
  return evicted;
}

StatusOr<std::optional<InsertOutcome>> Table::TryInsert(ItemInput& item) {
  ORRERY_RETURN_IF_ERROR(ValidateInput(item));
  std::unique_lock<std::mutex> lock(mu_);
  ORRERY_RETURN_IF_ERROR(CheckUsable());
  InsertOutcome out;
  if (auto it = remembered_.find(item.idempotency_key);
      !item.idempotency_key.empty() && it != remembered_.end()) {
    const IdempotencyRecord& first = it->second.record;
    if (first.group_id != item.group_id) {
      return InvalidArgumentError(
          "replay table '" + options_.name + "': the idempotency key was used by group " +
          std::to_string(first.group_id) + ", not group " + std::to_string(item.group_id));
    }
    out.key = first.key;
    out.dropped_stale = first.dropped_stale;
    out.duplicate = true;
    out.ticket = it->second.ticket;
    return std::optional<InsertOutcome>(out);
  }
  rocksdb::WriteBatch batch;
  if (IsStale(item.min_policy_version)) {
    ++state_.stale_evicted;
    out.dropped_stale = true;
    ORRERY_ASSIGN_OR_RETURN(out, CommitInsert(item, out, &batch));
    return std::optional<InsertOutcome>(out);
  }
  const int64_t cost = Cost(item.tokens);
  if (!limiter_.CanInsert(cost)) return std::optional<InsertOutcome>();
  while (static_cast<int64_t>(items_.size()) >= options_.max_size) {
    ORRERY_ASSIGN_OR_RETURN(Selection victim, remover_->Select(rng_));
    DeleteLocked(victim.key, &batch);
  }
  const uint64_t key = state_.next_key++;
  Item stored;
  stored.state.group_id = item.group_id;
  stored.state.priority = item.priority;
  stored.state.tokens = item.tokens;
  stored.state.min_policy_version = item.min_policy_version;
  stored.state.tiebreak = state_.next_tiebreak++;
  stored.state.inserted_unix_seconds = UnixSeconds();
  for (const std::string& t : item.trajectories) stored.bytes += static_cast<int64_t>(t.size());
  batch.Put(AsSlice(ItemRecordKey(options_.name, key)), AsSlice(EncodeItemState(stored.state)));
  PutPayload(&batch, PayloadRecordKey(options_.name, key), item.trajectories);
  if (storage_ == nullptr) {  // memory only: the table keeps the payload
    stored.trajectories =
        std::make_shared<const std::vector<std::string>>(std::move(item.trajectories));
  }
  ORRERY_RETURN_IF_ERROR(sampler_->Insert(key, stored.state.priority, stored.state.tiebreak));
  ORRERY_RETURN_IF_ERROR(remover_->Insert(key, stored.state.priority, stored.state.tiebreak));
  by_version_.insert({stored.state.min_policy_version, key});
  bytes_ += stored.bytes;
  items_.emplace(key, std::move(stored));
  limiter_.RecordInsert(cost);
  out.key = key;
  ORRERY_ASSIGN_OR_RETURN(out, CommitInsert(item, out, &batch));
  items_.at(key).ticket = out.ticket;
  lock.unlock();
  cv_.notify_all();
  return std::optional<InsertOutcome>(out);
}

StatusOr<std::vector<SampledItem>> Table::TrySample(const SampleOptions& options,
                                                    uint64_t* ticket) {
  std::vector<SampledItem> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ORRERY_ASSIGN_OR_RETURN(out, TrySampleLocked(options, ticket));
  }
  cv_.notify_all();
  return out;
}

StatusOr<std::vector<SampledItem>> Table::TrySampleLocked(const SampleOptions& options,
                                                          uint64_t* ticket) {
  ORRERY_RETURN_IF_ERROR(CheckUsable());
  if (options.max_items < 1) {
    return InvalidArgumentError("replay table '" + options_.name + "': max_items must be >= 1");
  }
  const bool claiming = !options.claimant.empty();
  if (claiming && options.batch_step < 0) {
    return InvalidArgumentError("replay table '" + options_.name +
                                "': a sample with a claimant needs batch_step >= 0");
  }
  rocksdb::WriteBatch batch;
  bool dirty = false;
  // Whether the write only counts (times_sampled, samples, the random offset): nothing can be
  // deleted or claimed and no batch is logged. Such a sample replies once the items it returns
  // are durable, and its own write becomes durable with the next fsync.
  bool counts_only = options_.max_times_sampled == 0 && options.batch_step < 0;
  uint64_t shown = 0;  // the latest write of an item returned
  if (options.learner_version > state_.learner_version) {
    state_.learner_version = options.learner_version;
    EvictStaleLocked(&batch);
    dirty = true;
    counts_only = false;
  }
  std::vector<SampledItem> out;
  // Claims an earlier session of this claimant never acknowledged come back first.
  for (auto& [key, c] : claimed_) {
    if (!claiming || static_cast<int>(out.size()) >= options.max_items) break;
    if (c.claim.claimant != options.claimant || c.claim.session == options.claim_session) continue;
    c.claim.session = options.claim_session;
    c.claim.step = options.batch_step;
    batch.Put(AsSlice(ClaimRecordKey(options_.name, key)), AsSlice(EncodeClaimRecord(c.claim)));
    SampledItem s;
    s.key = key;
    s.state = c.item.state;
    s.table_size = static_cast<int64_t>(items_.size());
    ORRERY_ASSIGN_OR_RETURN(s.trajectories, PayloadLocked(key, c.item));
    s.redelivered = true;
    out.push_back(std::move(s));
    dirty = true;
  }
  while (static_cast<int>(out.size()) < options.max_items && !items_.empty()) {
    const uint64_t rng_before = rng_.offset();
    ORRERY_ASSIGN_OR_RETURN(Selection sel, sampler_->Select(rng_));
    Item& item = items_.at(sel.key);
    const int64_t cost = Cost(item.state.tokens);
    if (!limiter_.CanSample(cost)) {
      rng_.set_offset(rng_before);  // a refused attempt consumes no randomness
      break;
    }
    SampledItem s;
    { ORRERY_ASSIGN_OR_RETURN(s.trajectories, PayloadLocked(sel.key, item)); }
    s.key = sel.key;
    s.probability = sel.probability;
    s.table_size = static_cast<int64_t>(items_.size());
    shown = std::max(shown, item.ticket);
    ++item.state.times_sampled;
    s.state = item.state;
    limiter_.RecordSample(cost);
    if (options_.max_times_sampled > 0 &&
        item.state.times_sampled >= static_cast<uint32_t>(options_.max_times_sampled)) {
      if (claiming) {
        ClaimLocked(sel.key, {options.claimant, options.claim_session, options.batch_step}, &batch);
      } else {
        DeleteLocked(sel.key, &batch);
      }
    } else {
      batch.Put(AsSlice(ItemRecordKey(options_.name, sel.key)),
                AsSlice(EncodeItemState(item.state)));
    }
    out.push_back(std::move(s));
    dirty = true;
  }
  if (!out.empty() && options.batch_step >= 0) {
    BatchLogEntry entry;
    entry.step = options.batch_step;
    entry.learner_version = state_.learner_version;
    entry.unix_seconds = UnixSeconds();
    for (const SampledItem& s : out) entry.keys.push_back(s.key);
    batch.Put(AsSlice(BatchRecordKey(options_.name, static_cast<uint64_t>(state_.batches_logged))),
              AsSlice(EncodeBatchLogEntry(entry)));
    ++state_.batches_logged;
  }
  if (dirty) {
    ORRERY_ASSIGN_OR_RETURN(const uint64_t t, Commit(&batch));
    if (ticket != nullptr) *ticket = counts_only ? shown : t;
  }
  return out;
}

// Records the blocked time of one blocking call when it returns, whatever the outcome.
class Table::BlockedTimer {
 public:
  BlockedTimer(BlockedTimeLog* log, BlockedOp op)
      : log_(log), op_(op), start_(UnixSeconds()), t0_(std::chrono::steady_clock::now()) {}
  ~BlockedTimer() {
    const auto waited = std::chrono::steady_clock::now() - t0_;
    log_->Add({op_, start_, std::chrono::duration<double>(waited).count()});
  }

 private:
  BlockedTimeLog* log_;
  BlockedOp op_;
  double start_;
  std::chrono::steady_clock::time_point t0_;
};

StatusOr<InsertOutcome> Table::Insert(ItemInput item, Deadline deadline) {
  std::optional<InsertOutcome> out;
  {
    BlockedTimer timer(&blocked_, BlockedOp::kInsert);
    while (true) {
      ORRERY_ASSIGN_OR_RETURN(out, TryInsert(item));
      if (out) break;
      std::unique_lock<std::mutex> lock(mu_);
      if (cancelled_) return CancelledError("replay table '" + options_.name + "' cancelled");
      ORRERY_RETURN_IF_ERROR(CheckUsable());
      if (limiter_.CanInsert(Cost(item.tokens))) continue;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
          !limiter_.CanInsert(Cost(item.tokens))) {
        return DeadlineExceededError("replay table '" + options_.name +
                                     "': insert blocked by the rate limiter until the deadline");
      }
    }
  }
  ORRERY_RETURN_IF_ERROR(WaitDurable(out->ticket));
  return *out;
}

StatusOr<std::vector<SampledItem>> Table::Sample(const SampleOptions& options, Deadline deadline) {
  std::vector<SampledItem> out;
  uint64_t ticket = 0;
  {
    BlockedTimer timer(&blocked_, BlockedOp::kSample);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (cancelled_) return CancelledError("replay table '" + options_.name + "' cancelled");
      ORRERY_ASSIGN_OR_RETURN(out, TrySampleLocked(options, &ticket));
      if (!out.empty()) break;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        ORRERY_ASSIGN_OR_RETURN(out, TrySampleLocked(options, &ticket));
        if (!out.empty()) break;
        return DeadlineExceededError("replay table '" + options_.name +
                                     "': nothing could be sampled before the deadline");
      }
    }
  }
  cv_.notify_all();
  ORRERY_RETURN_IF_ERROR(WaitDurable(ticket));
  return out;
}

StatusOr<UpdateOutcome> Table::UpdatePriorities(
    const std::vector<std::pair<uint64_t, double>>& updates, const std::vector<uint64_t>& deletes) {
  for (const auto& [key, p] : updates) {
    if (!(p >= 0) || !std::isfinite(p)) {
      return InvalidArgumentError("replay table '" + options_.name + "': priority for key " +
                                  std::to_string(key) + " must be finite and >= 0, got " +
                                  std::to_string(p) + " (no priority was changed)");
    }
  }
  UpdateOutcome out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ORRERY_RETURN_IF_ERROR(CheckUsable());
    rocksdb::WriteBatch batch;
    std::vector<uint64_t> updated;
    for (const auto& [key, p] : updates) {
      auto it = items_.find(key);
      if (it == items_.end()) {
        ++out.missing;
        continue;
      }
      it->second.state.priority = p;
      it->second.state.tiebreak = state_.next_tiebreak++;
      ORRERY_RETURN_IF_ERROR(sampler_->Update(key, p, it->second.state.tiebreak));
      ORRERY_RETURN_IF_ERROR(remover_->Update(key, p, it->second.state.tiebreak));
      batch.Put(AsSlice(ItemRecordKey(options_.name, key)),
                AsSlice(EncodeItemState(it->second.state)));
      updated.push_back(key);
      ++out.updated;
    }
    for (uint64_t key : deletes) {
      if (!items_.count(key)) {
        ++out.missing;
        continue;
      }
      DeleteLocked(key, &batch);
      ++out.deleted;
    }
    ORRERY_ASSIGN_OR_RETURN(out.ticket, Commit(&batch));
    for (uint64_t key : updated) {
      if (auto it = items_.find(key); it != items_.end()) it->second.ticket = out.ticket;
    }
  }
  cv_.notify_all();
  return out;
}

StatusOr<int64_t> Table::SetLearnerVersion(int64_t version, uint64_t* ticket) {
  int64_t evicted = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ORRERY_RETURN_IF_ERROR(CheckUsable());
    if (version <= state_.learner_version) {
      if (ticket != nullptr) *ticket = LastTicket();
      return int64_t{0};
    }
    state_.learner_version = version;
    rocksdb::WriteBatch batch;
    evicted = EvictStaleLocked(&batch);
    ORRERY_ASSIGN_OR_RETURN(const uint64_t t, Commit(&batch));
    if (ticket != nullptr) *ticket = t;
  }
  cv_.notify_all();
  return evicted;
}

StatusOr<int64_t> Table::Acknowledge(const std::string& claimant, int64_t through_step,
                                     uint64_t* ticket) {
  int64_t deleted = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ORRERY_RETURN_IF_ERROR(CheckUsable());
    rocksdb::WriteBatch batch;
    for (auto it = claimed_.begin(); it != claimed_.end();) {
      const ClaimRecord& c = it->second.claim;
      if (c.claimant != claimant || c.step > through_step) {
        ++it;
        continue;
      }
      limiter_.RecordDelete(Cost(it->second.item.state.tokens));
      bytes_ -= it->second.item.bytes;
      batch.Delete(AsSlice(ItemRecordKey(options_.name, it->first)));
      batch.Delete(AsSlice(PayloadRecordKey(options_.name, it->first)));
      batch.Delete(AsSlice(ClaimRecordKey(options_.name, it->first)));
      it = claimed_.erase(it);
      ++deleted;
    }
    // Nothing to delete (a repeated acknowledgement): reply after the latest write, which holds
    // the deletions of the first.
    uint64_t t = LastTicket();
    if (deleted > 0) {
      ORRERY_ASSIGN_OR_RETURN(t, Commit(&batch));
    }
    if (ticket != nullptr) *ticket = t;
  }
  cv_.notify_all();
  return deleted;
}

void Table::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

void Table::RecordBlocked(BlockedOp op, double start_unix_seconds, double blocked_seconds) {
  blocked_.Add({op, start_unix_seconds, blocked_seconds});
}

TableInfo Table::Info() const {
  TableInfo info;
  info.options = options_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info.counters = limiter_.counters();
    info.size = static_cast<int64_t>(items_.size());
    info.stale_evicted = state_.stale_evicted;
    info.learner_version = state_.learner_version;
    info.bytes = bytes_;
    info.batches_logged = state_.batches_logged;
    info.claimed = static_cast<int64_t>(claimed_.size());
  }
  info.insert_blocked = blocked_.Stats(BlockedOp::kInsert);
  info.sample_blocked = blocked_.Stats(BlockedOp::kSample);
  return info;
}

StatusOr<std::vector<BatchLogEntry>> Table::ReadBatchLog() const {
  std::vector<BatchLogEntry> out;
  if (storage_ == nullptr) return out;
  ORRERY_RETURN_IF_ERROR(storage_->ScanPrefix(
      BatchRecordPrefix(options_.name), [&](std::string_view, std::string_view value) -> Status {
        ORRERY_ASSIGN_OR_RETURN(BatchLogEntry e, DecodeBatchLogEntry(value));
        out.push_back(std::move(e));
        return Status::OK();
      }));
  return out;
}

std::vector<std::pair<uint64_t, ClaimRecord>> Table::Claims() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, ClaimRecord>> out;
  for (const auto& [key, c] : claimed_) out.emplace_back(key, c.claim);
  return out;
}

std::vector<std::pair<uint64_t, ItemState>> Table::Items() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, ItemState>> out;
  out.reserve(items_.size());
  for (const auto& [key, item] : items_) out.emplace_back(key, item.state);
  return out;
}

}  // namespace orrery::replay
