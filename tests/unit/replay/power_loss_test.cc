// Power loss: the PowerLossFileSystem's model (unsynced bytes and unsynced directory entries are
// lost), then the replay store under random power cuts. Each round opens the store on the files
// that survived the last cut, runs random inserts, samples (logged as learner batches, half of
// them claiming for a learner whose session changes every round, so claims are redelivered),
// acknowledgements of those claims, priority updates with deletions, samples of a second table
// that only count (no max_times_sampled, no batch log) and a checkpoint, and cuts the power at a
// random mutating file-system call (inside any of those operations, RocksDB's flushes and
// compactions included). After the cut the store is reopened and must hold exactly the state
// after some prefix of the operations that contains every acknowledged one (every operation that
// returned, in both sync modes: a sample, an acknowledgement and a priority update return, or are
// replied to, only once durable) and every one whose write an fsync had made durable, with every
// item's exact payload and every claim: nothing acknowledged lost, nothing unacknowledged half
// there. The one exception: with group commit a sample that only counts returns before its own
// fsync, so the prefix may end before it; its times_sampled and sample count come back at least
// as they were at the last fsync and at most as acknowledged. An acknowledged checkpoint must
// survive the cut with everything acknowledged before it. The insert in flight at the cut is
// retried with its idempotency key and must end up stored exactly once.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "actors/replay/power_loss_fs.h"
#include "actors/replay/records.h"
#include "actors/replay/store.h"
#include "core/philox.h"
#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file written through `fs` with `sync` after the first `synced` bytes.
Status WriteFile(PowerLossFileSystem& fs, const std::string& path, const std::string& synced,
                 const std::string& unsynced) {
  std::unique_ptr<rocksdb::FSWritableFile> f;
  const rocksdb::IOOptions io;
  rocksdb::IOStatus s = fs.NewWritableFile(path, rocksdb::FileOptions(), &f, nullptr);
  if (s.ok()) s = f->Append(synced, io, nullptr);
  if (s.ok()) s = f->Sync(io, nullptr);
  if (s.ok()) s = f->Append(unsynced, io, nullptr);
  if (s.ok()) s = f->Close(io, nullptr);
  return s.ok() ? Status::OK() : IoError(s.ToString());
}

Status SyncDir(PowerLossFileSystem& fs, const std::string& dir) {
  std::unique_ptr<rocksdb::FSDirectory> d;
  rocksdb::IOStatus s = fs.NewDirectory(dir, rocksdb::IOOptions(), &d, nullptr);
  if (s.ok()) s = d->Fsync(rocksdb::IOOptions(), nullptr);
  return s.ok() ? Status::OK() : IoError(s.ToString());
}

TEST(PowerLossFileSystemTest, DropsUnsyncedBytesAndUnsyncedEntries) {
  TestDir dir;
  PowerLossFileSystem fs;
  ASSERT_TRUE(WriteFile(fs, dir.Sub("kept"), "durable", "-lost").ok());
  ASSERT_TRUE(SyncDir(fs, dir.path()).ok());
  ASSERT_TRUE(WriteFile(fs, dir.Sub("new"), "synced data", "").ok());  // entry never synced
  fs.CutPower();
  EXPECT_FALSE(WriteFile(fs, dir.Sub("after"), "x", "").ok());  // nothing works without power
  ASSERT_TRUE(fs.RestorePower().ok());
  EXPECT_EQ(ReadAll(dir.Sub("kept")), "durable");
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("new")));
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("after")));
}

TEST(PowerLossFileSystemTest, AnUnsyncedRenameOverAFileBringsTheOldFileBack) {
  TestDir dir;
  PowerLossFileSystem fs;
  const rocksdb::IOOptions io;
  ASSERT_TRUE(WriteFile(fs, dir.Sub("CURRENT"), "old", "").ok());
  ASSERT_TRUE(SyncDir(fs, dir.path()).ok());
  ASSERT_TRUE(WriteFile(fs, dir.Sub("tmp"), "new", "").ok());
  ASSERT_TRUE(fs.RenameFile(dir.Sub("tmp"), dir.Sub("CURRENT"), io, nullptr).ok());
  EXPECT_EQ(ReadAll(dir.Sub("CURRENT")), "new");
  fs.CutPower();
  ASSERT_TRUE(fs.RestorePower().ok());
  EXPECT_EQ(ReadAll(dir.Sub("CURRENT")), "old");
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("tmp")));
  // Synced this time: the rename stays, and the kept copy of the old file is gone.
  ASSERT_TRUE(WriteFile(fs, dir.Sub("tmp"), "new", "").ok());
  ASSERT_TRUE(fs.RenameFile(dir.Sub("tmp"), dir.Sub("CURRENT"), io, nullptr).ok());
  ASSERT_TRUE(SyncDir(fs, dir.path()).ok());
  fs.CutPower();
  ASSERT_TRUE(fs.RestorePower().ok());
  EXPECT_EQ(ReadAll(dir.Sub("CURRENT")), "new");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(PowerLossFileSystemTest, CutPowerAfterCountsMutatingCalls) {
  TestDir dir;
  PowerLossFileSystem fs;
  fs.CutPowerAfter(4);  // create, append, sync go through; the second append fails
  EXPECT_FALSE(WriteFile(fs, dir.Sub("f"), "a", "b").ok());
  EXPECT_FALSE(fs.powered());
  EXPECT_EQ(fs.mutations(), 3u);
  ASSERT_TRUE(fs.RestorePower().ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("f")));  // its directory was never synced
}

// --- The replay store under random power cuts ---

constexpr char kTable[] = "t";
constexpr char kCounted[] = "c";  // uniform, unlimited max_times_sampled: its samples only count

// The payload of group g: 1-3 trajectories of 1 B to 16 KiB, the same on every call.
std::vector<std::string> Payload(uint64_t g) {
  PhiloxGenerator rng(g, 7);
  std::vector<std::string> out(1 + rng.UniformInt(3));
  for (std::string& t : out) {
    t.resize(1 + rng.UniformInt(16 << 10));
    for (char& c : t) c = static_cast<char>(rng.NextU32());
  }
  return out;
}

ItemInput GroupInput(uint64_t g) {
  ItemInput in;
  in.group_id = g;
  in.priority = 1.0 + static_cast<double>(g % 5);
  in.tokens = 1;
  in.trajectories = Payload(g);
  in.idempotency_key = "group/" + std::to_string(g);
  return in;
}

// Everything the table would recover: counters, learner state and every item's state, exactly.
std::string TableDigest(const Table& t) {
  const TableInfo info = t.Info();
  std::ostringstream out;
  out << "i" << info.counters.inserts << " s" << info.counters.samples << " d"
      << info.counters.deletes << " n" << info.size << " b" << info.batches_logged << " v"
      << info.learner_version << " by" << info.bytes << ";";
  for (const auto& [key, s] : t.Items()) {
    char prio[64];
    std::snprintf(prio, sizeof(prio), "%a", s.priority);
    out << key << ":" << s.group_id << "," << prio << "," << s.times_sampled << "," << s.tokens
        << "," << s.tiebreak << ";";
  }
  out << " claimed";
  for (const auto& [key, c] : t.Claims()) {
    out << " " << key << ":" << c.claimant << "," << c.session << "," << c.step;
  }
  return out.str();
}

// Everything the store would recover: both tables.
std::string Digest(ReplayStore& store) {
  return TableDigest(**store.Find(kTable)) + " | " + TableDigest(**store.Find(kCounted));
}

// Every stored payload equals its group's, and every item has one.
void ExpectExactPayloads(const Table& t) {
  std::map<uint64_t, uint64_t> group_of;
  for (const auto& [key, s] : t.Items()) group_of[key] = s.group_id;
  std::set<uint64_t> claimed;
  for (const auto& [key, c] : t.Claims()) claimed.insert(key);
  size_t seen = 0;
  Status s = t.storage()->ScanPrefix(
      PayloadRecordPrefix(t.name()), [&](std::string_view k, std::string_view v) -> Status {
        ORRERY_ASSIGN_OR_RETURN(uint64_t key, RecordKeyNumber(k));
        ORRERY_ASSIGN_OR_RETURN(std::vector<std::string> payload, DecodePayload(v));
        if (claimed.count(key)) {  // a claimed item keeps its payload; its group is not listed
          ++seen;
          return Status::OK();
        }
        EXPECT_TRUE(group_of.count(key)) << "payload without item " << key;
        if (group_of.count(key)) {
          EXPECT_EQ(payload, Payload(group_of[key])) << "item " << key;
        }
        ++seen;
        return Status::OK();
      });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seen, group_of.size() + claimed.size());
}

ReplayConfig StoreConfig(const std::string& path, rocksdb::Env* env, bool per_insert) {
  ReplayConfig c;
  c.storage.path = path;
  c.storage.env = env;
  c.storage.sync_each_write = per_insert;
  c.storage.group_commit_ms = 1;
  c.storage.compression = "none";
  TableOptions t;
  t.name = kTable;
  t.sampler = {SelectorKind::kPrioritized, 0.7};
  t.remover = {SelectorKind::kFifo, 1.0};
  t.max_size = 150;
  t.max_times_sampled = 3;
  t.limiter = *MinSizeLimiter(1);
  t.seed = 11;
  c.tables.push_back(t);
  TableOptions counted;
  counted.name = kCounted;
  counted.max_size = 150;
  counted.limiter = *MinSizeLimiter(1);
  counted.seed = 12;
  c.tables.push_back(counted);
  return c;
}

// The index of the first of `snapshots[from..]` equal to `digest`, or nullopt.
std::optional<size_t> FindSnapshot(const std::vector<std::string>& snapshots, size_t from,
                                   const std::string& digest) {
  for (size_t i = from; i < snapshots.size(); ++i) {
    if (snapshots[i] == digest) return i;
  }
  return std::nullopt;
}

struct InFlight {
  std::string table;
  uint64_t group = 0;
  size_t index = 0;      // the snapshot after it
  bool durable = false;  // it returned OK (the reply was "lost" with the power)
};

TEST(PowerLossTest, AcknowledgedStateSurvivesRandomPowerCuts) {
  constexpr int kRounds = 120;
  constexpr int kMaxOps = 24;
  TestDir dir;
  auto fs = std::make_shared<PowerLossFileSystem>();
  std::unique_ptr<rocksdb::Env> env = NewPowerLossEnv(fs);
  const std::string db = dir.Sub("db");
  PhiloxGenerator rng(2024, 28);
  uint64_t next_group = 1;
  int64_t next_step = 0;
  std::map<std::string, int> cuts_in;  // operation kind -> power cuts that landed in it
  int power_losses = 0, retries_answered_first = 0, checkpoints_checked = 0;
  int64_t claims_acknowledged = 0, claims_recovered = 0, counted_samples_lost = 0;
  for (int round = 0; round < kRounds; ++round) {
    const bool per_insert = round % 2 == 0;
    SCOPED_TRACE("round " + std::to_string(round) + (per_insert ? " per_insert" : " group"));
    StatusOr<std::unique_ptr<ReplayStore>> opened =
        ReplayStore::Open(StoreConfig(db, env.get(), per_insert));
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    std::unique_ptr<ReplayStore> store = std::move(*opened);
    Table* t = *store->Find(kTable);
    Table* c = *store->Find(kCounted);

    std::vector<std::string> snapshots = {Digest(*store)};
    // The storage ticket of the latest write after each operation (group commit), and whether
    // the operation was a sample that only counted and returned.
    std::vector<uint64_t> tickets = {t->storage()->last_ticket()};
    std::vector<bool> counted_sample = {false};
    size_t required = 0;  // every acknowledged operation is in snapshots[0..required]
    std::optional<InFlight> in_flight;
    struct Checkpoint {
      std::string dir;
      size_t from = 0, to = 0;
    };
    std::optional<Checkpoint> checkpoint;
    fs->CutPowerAfter(1 + rng.UniformInt(90));
    std::string kind = "between operations";
    for (int op = 0; op < kMaxOps; ++op) {
      const uint64_t r = rng.UniformInt(100);
      Status status;
      bool acknowledged = false;
      bool counted = false;  // a sample that only counts returned before its own fsync
      if (r < 50 || t->Info().size == 0 || (r >= 90 && r < 97 && c->Info().size == 0)) {
        kind = "insert";
        const uint64_t g = next_group++;
        Table* into = r % 4 == 0 ? c : t;
        StatusOr<InsertOutcome> out = into->Insert(GroupInput(g), DeadlineFromTimeoutMs(0));
        status = out.status();
        acknowledged = status.ok();
        in_flight = InFlight{into->name(), g, snapshots.size(), status.ok()};
        if (status.ok()) {
          ASSERT_FALSE(out->duplicate);
        }
      } else if (r < 70) {
        kind = "sample";
        SampleOptions so;
        so.max_items = 1 + static_cast<int>(rng.UniformInt(4));
        so.batch_step = next_step++;
        if (rng.UniformInt(2) == 0) {  // a learner's claim; each round is a new incarnation
          so.claimant = "learner/0";
          so.claim_session = static_cast<uint64_t>(round) + 1;
        }
        status = t->Sample(so, DeadlineFromTimeoutMs(0)).status();  // returns once durable
        // Nothing sampleable (every item claimed): nothing was written.
        if (status.code() == StatusCode::kDeadlineExceeded && fs->powered()) status = Status::OK();
        acknowledged = status.ok();
      } else if (r < 80) {
        kind = "acknowledge";
        uint64_t ticket = 0;
        const int64_t claimed_before = t->Info().claimed;
        status = t->Acknowledge("learner/0",
                                next_step - 1 - static_cast<int64_t>(rng.UniformInt(3)), &ticket)
                     .status();
        if (status.ok()) status = t->storage()->WaitDurable(ticket);
        acknowledged = status.ok();
        if (status.ok()) claims_acknowledged += claimed_before - t->Info().claimed;
      } else if (r < 90) {
        kind = "priority update";
        std::vector<std::pair<uint64_t, double>> updates;
        std::vector<uint64_t> deletes;
        const auto items = t->Items();
        for (int i = 0; i < 3; ++i) {
          const uint64_t key = items[rng.UniformInt(items.size())].first;
          updates.emplace_back(key, 0.25 * static_cast<double>(1 + rng.UniformInt(16)));
        }
        if (rng.UniformInt(3) == 0) deletes.push_back(items[rng.UniformInt(items.size())].first);
        StatusOr<UpdateOutcome> updated = t->UpdatePriorities(updates, deletes);
        status = updated.status();
        if (status.ok()) status = t->storage()->WaitDurable(updated->ticket);  // the reply waits
        acknowledged = status.ok();
      } else if (r < 97) {
        kind = "sample that only counts";
        status = c->Sample(SampleOptions(1 + static_cast<int>(rng.UniformInt(4))),
                           DeadlineFromTimeoutMs(0))
                     .status();
        // Durable on return with per-insert fsync; with group commit only what it shows is.
        acknowledged = status.ok() && per_insert;
        counted = status.ok() && !per_insert;
      } else {
        kind = "checkpoint";
        const std::string ckpt =
            dir.Sub("ckpt-" + std::to_string(round) + "-" + std::to_string(op));
        const size_t from = required;
        status = store->Checkpoint(ckpt).status();
        if (status.ok()) checkpoint = Checkpoint{ckpt, from, snapshots.size() - 1};
      }
      snapshots.push_back(Digest(*store));
      tickets.push_back(t->storage()->last_ticket());
      counted_sample.push_back(counted);
      if (!status.ok()) {
        ASSERT_FALSE(fs->powered()) << kind << " failed with the power on: " << status.ToString();
        break;
      }
      if (kind != "insert") in_flight.reset();
      if (acknowledged) required = snapshots.size() - 1;
      if (!fs->powered()) break;  // cut in a background thread (syncer, flush, compaction)
      if (kind == "insert" && rng.UniformInt(32) == 0) {
        kind = "reply of a committed insert";  // the reply is lost with the power
        fs->CutPower();
        break;
      }
    }
    if (fs->powered()) {
      kind = "between operations";
      fs->CutPower();
    }
    ++cuts_in[kind];
    ++power_losses;
    // Every operation whose own write an fsync made durable before the cut is in the prefix too
    // (the one write of an operation that wrote: its ticket is above the one before it).
    const uint64_t durable = t->storage()->durable_ticket();
    for (size_t i = required + 1; i < tickets.size(); ++i) {
      if (tickets[i] > tickets[i - 1] && tickets[i] <= durable) required = i;
    }
    store.reset();  // the process dies: nothing more reaches the disk
    ASSERT_TRUE(fs->RestorePower().ok());

    opened = ReplayStore::Open(StoreConfig(db, env.get(), per_insert));
    ASSERT_TRUE(opened.ok()) << "recovery after a cut in " << kind << ": "
                             << opened.status().ToString();
    store = std::move(*opened);
    t = *store->Find(kTable);
    const std::string recovered = Digest(*store);
    const std::optional<size_t> at = FindSnapshot(snapshots, required, recovered);
    ASSERT_TRUE(at.has_value()) << "after a cut in " << kind << " the store holds neither the "
                                << "state after the last acknowledged or synced operation ("
                                << required << " of " << snapshots.size() - 1
                                << ") nor a later one\n"
                                << "recovered: " << recovered
                                << "\nrequired: " << snapshots[required];
    for (size_t i = *at + 1; i < counted_sample.size(); ++i)
      counted_samples_lost += counted_sample[i];
    ExpectExactPayloads(*t);
    ExpectExactPayloads(**store->Find(kCounted));
    claims_recovered += t->Info().claimed;

    if (checkpoint) {
      ASSERT_TRUE(std::filesystem::exists(checkpoint->dir + "/CURRENT"))
          << "the acknowledged checkpoint " << checkpoint->dir << " did not survive the cut";
      StatusOr<std::unique_ptr<ReplayStore>> copy =
          ReplayStore::Open(StoreConfig(checkpoint->dir, nullptr, true));
      ASSERT_TRUE(copy.ok()) << "an acknowledged checkpoint did not survive: "
                             << copy.status().ToString();
      const std::string digest = Digest(**copy);
      const std::optional<size_t> cat = FindSnapshot(snapshots, checkpoint->from, digest);
      EXPECT_TRUE(cat.has_value() && *cat <= checkpoint->to)
          << "checkpoint " << checkpoint->dir << " holds " << digest;
      ExpectExactPayloads(**(*copy)->Find(kTable));
      ExpectExactPayloads(**(*copy)->Find(kCounted));
      ++checkpoints_checked;
    }

    if (in_flight) {
      // The rollout's retry: the same idempotency key. Stored once, whatever the cut took.
      Table* into = *store->Find(in_flight->table);
      std::optional<uint64_t> recovered_key;
      for (const auto& [key, s] : into->Items()) {
        if (s.group_id == in_flight->group) recovered_key = key;
      }
      if (in_flight->durable) {
        ASSERT_TRUE(recovered_key.has_value()) << "an insert that returned was lost";
      }
      StatusOr<InsertOutcome> retry =
          into->Insert(GroupInput(in_flight->group), DeadlineFromTimeoutMs(0));
      ASSERT_TRUE(retry.ok()) << retry.status().ToString();
      EXPECT_EQ(retry->duplicate, recovered_key.has_value());
      if (recovered_key) {
        EXPECT_EQ(retry->key, *recovered_key);
        ++retries_answered_first;
      }
      int copies = 0;
      for (const auto& [key, s] : into->Items()) copies += s.group_id == in_flight->group;
      EXPECT_EQ(copies, 1) << "group " << in_flight->group;
    }
    if (HasFatalFailure()) return;
  }
  std::ostringstream summary;
  summary << power_losses << " simulated power losses (";
  for (const auto& [kind, n] : cuts_in) summary << kind << " " << n << ", ";
  summary << "), " << retries_answered_first
          << " retries of the last insert answered with the first outcome, " << checkpoints_checked
          << " acknowledged checkpoints checked after the cut, " << claims_recovered
          << " claims recovered after cuts, " << claims_acknowledged << " claims acknowledged, "
          << counted_samples_lost << " samples that only counted lost with the power";
  std::printf("%s\n", summary.str().c_str());
  EXPECT_GE(power_losses, 100);
  EXPECT_GT(retries_answered_first, 0);
  EXPECT_GT(checkpoints_checked, 0);
  EXPECT_GT(claims_recovered, 0);
  EXPECT_GT(claims_acknowledged, 0);
  // A sample that only counts returns before its fsync: some must be taken back by a cut.
  EXPECT_GT(counted_samples_lost, 0);
  for (const char* kind : {"insert", "sample", "priority update", "sample that only counts",
                           "checkpoint", "reply of a committed insert"}) {
    EXPECT_GT(cuts_in[kind], 0) << "no power cut landed in a " << kind;
  }
}

}  // namespace
}  // namespace orrery::replay
