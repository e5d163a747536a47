// Durable before visible (group commit): ReplayService holds every reply that follows a write
// until that write's WAL fsync. Each test cuts the power (PowerLossFileSystem) at the instant a
// chosen reply is sent, restarts the store from what survived and checks that it holds what the
// reply showed: an item a sample returned (inserted by another producer, its own ack still
// pending), the sample's deletions and counters, a priority update, the learner version, and a
// claimant's acknowledgement. A sample that only counts (a table without max_times_sampled, no
// batch log) replies before its own fsync, so the power may take back its times_sampled and
// sample count, but it still waits for the items it shows (their insert, their priority). Also:
// claims (SampleOptions::claimant) keep sampled queue items until acknowledged, across restarts,
// and hand them back to the claimant's next session.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "actors/replay/capnp_io.h"
#include "actors/replay/power_loss_fs.h"
#include "actors/replay/service.h"
#include "actors/replay/wire.h"
#include "actors/schema/replay.capnp.h"
#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

constexpr char kTable[] = "q";
constexpr char kCounted[] = "c";  // its samples only count: unlimited max_times_sampled

ReplayConfig Config(const std::string& path, rocksdb::Env* env) {
  ReplayConfig c;
  c.storage.path = path;
  c.storage.env = env;
  c.storage.sync_each_write = false;
  // Long enough that a write right after an fsync stays unsynced while the test looks at it.
  c.storage.group_commit_ms = 300;
  c.storage.compression = "none";
  TableOptions t;
  t.name = kTable;
  t.sampler = t.remover = {SelectorKind::kFifo, 1.0};
  t.max_times_sampled = 1;
  t.max_size = 16;
  t.limiter = *QueueLimiter(16);
  t.max_staleness = 2;
  c.tables.push_back(t);
  TableOptions counted;
  counted.name = kCounted;
  counted.sampler = {SelectorKind::kLifo, 1.0};  // the newest item: the one still unsynced
  counted.max_size = 16;
  counted.limiter = *MinSizeLimiter(1);
  c.tables.push_back(counted);
  return c;
}

using Fill = std::function<void(schema::ReplayRequest::Builder)>;

std::string Request(uint64_t id, const Fill& fill) {
  capnp::MallocMessageBuilder builder;
  auto req = builder.initRoot<schema::ReplayRequest>();
  req.setId(id);
  req.setTimeoutMs(0);
  fill(req);
  return CapnpToBytes(builder);
}

Fill InsertOf(uint64_t group, const std::string& table = kTable) {
  return [group, table](schema::ReplayRequest::Builder req) {
    auto in = req.initInsert();
    in.setTable(table);
    in.setGroupId(group);
    in.setPriority(1.0);
    in.setTokens(1);
    in.setMinPolicyVersion(10);
    const std::string payload = "payload of group " + std::to_string(group);
    in.initTrajectories(1).set(
        0, kj::ArrayPtr<const kj::byte>(reinterpret_cast<const kj::byte*>(payload.data()),
                                        payload.size()));
  };
}

Fill SampleOf(int max_items, int64_t step, const std::string& claimant = "",
              const std::string& table = kTable) {
  return [=](schema::ReplayRequest::Builder req) {
    auto in = req.initSample();
    in.setTable(table);
    in.setMaxItems(static_cast<uint32_t>(max_items));
    in.setLearnerVersion(-1);
    in.setBatchStep(step);
    in.setClaimant(claimant);
    in.setClaimSession(1);
  };
}

// A store on a power-loss file system and its service; replies are kept by id, and the power
// goes off at the instant the reply with id cut_on_ is sent.
class Harness {
 public:
  Harness() : fs_(std::make_shared<PowerLossFileSystem>()), env_(NewPowerLossEnv(fs_)) { Open(); }

  void Open() {
    service_.reset();
    store_.reset();
    StatusOr<std::unique_ptr<ReplayStore>> store =
        ReplayStore::Open(Config(dir_.Sub("db"), env_.get()));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    service_ = std::make_unique<ReplayService>(
        store_.get(), [this](const std::string&, kj::Array<capnp::word> reply) {
          const auto bytes = reply.asBytes();
          const std::string flat(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
          uint64_t id = 0;
          std::string error;
          (void)ReadCapnpMessage<schema::ReplayReply>(flat, "reply", [&](auto r) {
            id = r.getId();
            if (r.isError()) error = r.getError().getMessage();
            if (r.isSample()) {
              for (auto item : r.getSample()) sampled_[id].push_back(item.getKey());
            }
            return Status::OK();
          });
          replies_[id] = error;
          if (cut_on_ == id) fs_->CutPower();
        });
  }

  // Sends a request and serves until its reply left (10 s at most); its error message, or "".
  std::optional<std::string> Call(uint64_t id, const Fill& fill) {
    service_->HandleRequest("peer", Request(id, fill));
    return Await(id);
  }
  std::optional<std::string> Await(uint64_t id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!replies_.count(id) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      service_->Poll();
    }
    if (!replies_.count(id)) return std::nullopt;
    return replies_[id];
  }
  void Send(uint64_t id, const Fill& fill) { service_->HandleRequest("peer", Request(id, fill)); }
  void CutPowerOnReply(uint64_t id) { cut_on_ = id; }

  // The process dies with the power; the store restarts on what the disk kept.
  void Restart() {
    service_.reset();
    store_.reset();
    ASSERT_TRUE(fs_->RestorePower().ok());
    cut_on_ = 0;
    Open();
  }

  Table& table(const std::string& name = kTable) { return **store_->Find(name); }
  const std::vector<uint64_t>& sampled(uint64_t id) { return sampled_[id]; }

 private:
  TestDir dir_;
  std::shared_ptr<PowerLossFileSystem> fs_;
  std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<ReplayStore> store_;
  std::unique_ptr<ReplayService> service_;
  std::map<uint64_t, std::string> replies_;
  std::map<uint64_t, std::vector<uint64_t>> sampled_;
  uint64_t cut_on_ = 0;
};

TEST(DurableReplyTest, ASampledItemAndTheSampleSurviveACutAtTheSampleReply) {
  Harness h;
  ASSERT_EQ(h.Call(1, InsertOf(1)), "");  // fsynced at once: the syncer was idle
  h.Send(2, InsertOf(2));                 // written; its fsync waits for the interval
  h.CutPowerOnReply(3);
  ASSERT_EQ(h.Call(3, SampleOf(2, 0)), "");
  ASSERT_EQ(h.sampled(3).size(), 2u) << "the sample returned the unacknowledged insert too";
  h.Restart();
  const TableInfo info = h.table().Info();
  EXPECT_EQ(info.counters.inserts, 2) << "a sampled item was lost with the power";
  EXPECT_EQ(info.counters.samples, 2) << "the sample was lost with the power";
  EXPECT_EQ(info.size, 0) << "a queue item served before the cut is back";
  EXPECT_EQ(info.batches_logged, 1);
}

TEST(DurableReplyTest, ASampleThatOnlyCountsRepliesBeforeItsOwnFsync) {
  Harness h;
  ASSERT_EQ(h.Call(1, InsertOf(1, kCounted)), "");  // fsynced at once: the syncer was idle
  h.CutPowerOnReply(2);  // the sample's own write waits 300 ms for the next fsync
  ASSERT_EQ(h.Call(2, SampleOf(1, -1, "", kCounted)), "");
  ASSERT_EQ(h.sampled(2).size(), 1u);
  h.Restart();
  const TableInfo info = h.table(kCounted).Info();
  EXPECT_EQ(info.counters.inserts, 1);
  EXPECT_EQ(info.counters.samples, 0) << "the sample was not meant to wait for its fsync";
  ASSERT_EQ(h.table(kCounted).Items().size(), 1u);
  EXPECT_EQ(h.table(kCounted).Items()[0].second.times_sampled, 0u);
}

TEST(DurableReplyTest, ASampleThatOnlyCountsWaitsForTheItemItShows) {
  Harness h;
  ASSERT_EQ(h.Call(1, InsertOf(1, kCounted)), "");
  h.Send(2, InsertOf(2, kCounted));  // written; its fsync waits for the interval
  h.CutPowerOnReply(3);
  ASSERT_EQ(h.Call(3, SampleOf(1, -1, "", kCounted)), "");
  ASSERT_EQ(h.sampled(3).size(), 1u);
  h.Restart();
  ASSERT_EQ(h.table(kCounted).Info().counters.inserts, 2)
      << "an item a sample returned was lost with the power";
  EXPECT_EQ(h.table(kCounted).Items().back().first, h.sampled(3)[0]);

  // A priority update of the item a sample shows: the sample replies after the update's fsync.
  const uint64_t key = h.sampled(3)[0];
  ASSERT_EQ(h.Call(6, InsertOf(3)), "");  // an fsync now: the update's waits for the interval
  h.Send(4, [key](schema::ReplayRequest::Builder req) {
    auto in = req.initUpdatePriorities();
    in.setTable(kCounted);
    in.initKeys(1).set(0, key);
    in.initPriorities(1).set(0, 5.0);
  });
  h.CutPowerOnReply(5);
  ASSERT_EQ(h.Call(5, SampleOf(1, -1, "", kCounted)), "");
  ASSERT_EQ(h.sampled(5), std::vector<uint64_t>{key});
  h.Restart();
  EXPECT_EQ(h.table(kCounted).Items().back().second.priority, 5.0)
      << "the priority a sample showed was lost with the power";
}

TEST(DurableReplyTest, PriorityUpdateAndLearnerVersionSurviveACutAtTheirReplies) {
  Harness h;
  ASSERT_EQ(h.Call(1, InsertOf(1)), "");
  const uint64_t key = h.table().Items().at(0).first;
  h.CutPowerOnReply(2);
  ASSERT_EQ(h.Call(2,
                   [key](schema::ReplayRequest::Builder req) {
                     auto in = req.initUpdatePriorities();
                     in.setTable(kTable);
                     in.initKeys(1).set(0, key);
                     in.initPriorities(1).set(0, 5.0);
                   }),
            "");
  h.Restart();
  ASSERT_EQ(h.table().Items().size(), 1u);
  EXPECT_EQ(h.table().Items()[0].second.priority, 5.0) << "the acknowledged update was lost";

  h.CutPowerOnReply(3);
  ASSERT_EQ(h.Call(3,
                   [](schema::ReplayRequest::Builder req) {
                     auto in = req.initSetLearnerVersion();
                     in.setTable(kTable);
                     in.setVersion(20);  // the item (version 10) is outside the window of 2
                   }),
            "");
  h.Restart();
  EXPECT_EQ(h.table().Info().learner_version, 20);
  EXPECT_EQ(h.table().Info().size, 0);
  EXPECT_EQ(h.table().Info().stale_evicted, 1);
}

TEST(DurableReplyTest, ClaimsSurviveACutAndAreDeletedByADurableAcknowledgement) {
  Harness h;
  for (uint64_t g = 1; g <= 3; ++g) ASSERT_EQ(h.Call(g, InsertOf(g)), "");
  h.CutPowerOnReply(10);
  ASSERT_EQ(h.Call(10, SampleOf(2, 7, "learner/0")), "");
  ASSERT_EQ(h.sampled(10).size(), 2u);
  h.Restart();  // the learner never saw the reply land in its batch log
  EXPECT_EQ(h.table().Info().claimed, 2);
  EXPECT_EQ(h.table().Info().size, 1);

  h.CutPowerOnReply(11);
  ASSERT_EQ(h.Call(11,
                   [](schema::ReplayRequest::Builder req) {
                     auto in = req.initAcknowledge();
                     in.setTable(kTable);
                     in.setClaimant("learner/0");
                     in.setThroughStep(7);
                   }),
            "");
  h.Restart();
  const TableInfo info = h.table().Info();
  EXPECT_EQ(info.claimed, 0) << "the acknowledgement was lost with the power";
  EXPECT_EQ(info.size, 1);
  EXPECT_EQ(info.counters.deletes, 2);
  EXPECT_EQ(h.Call(12,
                   [](schema::ReplayRequest::Builder req) {
                     auto in = req.initAcknowledge();
                     in.setTable(kTable);
                     in.setClaimant("");
                     in.setThroughStep(7);
                   }),
            std::optional<std::string>("replay acknowledge: empty claimant"));
}

// --- Claims, in process ---

ItemInput Group(uint64_t g) {
  ItemInput in;
  in.group_id = g;
  in.tokens = 1;
  in.trajectories = {"group " + std::to_string(g)};
  return in;
}

SampleOptions Claiming(int max_items, int64_t step, const std::string& claimant, uint64_t session) {
  SampleOptions o;
  o.max_items = max_items;
  o.batch_step = step;
  o.claimant = claimant;
  o.claim_session = session;
  return o;
}

TEST(ClaimTest, AClaimantsNextSessionGetsItsUnacknowledgedClaimsBack) {
  TestDir dir;
  ReplayConfig config = Config(dir.Sub("db"), nullptr);
  config.storage.sync_each_write = true;
  std::vector<uint64_t> claimed_keys;
  {
    auto store = *ReplayStore::Open(config);
    Table* t = *store->Find(kTable);
    for (uint64_t g = 1; g <= 3; ++g) ASSERT_TRUE(t->Insert(Group(g), NoDeadline()).ok());
    auto first = t->Sample(Claiming(2, 4, "learner/0", 1), DeadlineFromTimeoutMs(0));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_EQ(first->size(), 2u);
    for (const SampledItem& s : *first) {
      EXPECT_FALSE(s.redelivered);
      claimed_keys.push_back(s.key);
    }
    // Claimed items are not sampled again, not by the same session, not by another claimant.
    auto other = t->Sample(Claiming(4, 0, "learner/1", 9), DeadlineFromTimeoutMs(0));
    ASSERT_TRUE(other.ok());
    ASSERT_EQ(other->size(), 1u);
    EXPECT_EQ(other->at(0).state.group_id, 3u);
    EXPECT_EQ(t->Info().claimed, 3);
    EXPECT_EQ(t->Info().counters.deletes, 0) << "a claim is no deletion until acknowledged";
    EXPECT_EQ(t->Sample(Claiming(4, 5, "learner/0", 1), DeadlineFromTimeoutMs(0)).status().code(),
              StatusCode::kDeadlineExceeded);
  }  // the learner died before its batch log was safe; the store restarts too
  auto store = *ReplayStore::Open(config);
  Table* t = *store->Find(kTable);
  EXPECT_EQ(t->Info().claimed, 3);
  auto again = t->Sample(Claiming(4, 4, "learner/0", 2), DeadlineFromTimeoutMs(0));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->size(), 2u) << "only learner/0's claims come back";
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(again->at(i).key, claimed_keys[i]);
    EXPECT_TRUE(again->at(i).redelivered);
    EXPECT_EQ(*again->at(i).trajectories,
              std::vector<std::string>{"group " + std::to_string(i + 1)});
    EXPECT_EQ(again->at(i).state.times_sampled, 1u);
  }
  EXPECT_EQ(t->Info().counters.samples, 3) << "a redelivery is not a new sample";
  // The same session does not get them twice.
  EXPECT_EQ(t->TrySample(Claiming(4, 4, "learner/0", 2))->size(), 0u);

  EXPECT_EQ(*t->Acknowledge("learner/0", 3), 0) << "claims of step 4 are not covered by 3";
  EXPECT_EQ(*t->Acknowledge("learner/0", 4), 2);
  EXPECT_EQ(*t->Acknowledge("learner/0", 4), 0);
  EXPECT_EQ(t->Info().counters.deletes, 2);
  EXPECT_EQ(t->Info().claimed, 1);
  EXPECT_EQ(t->Claims().at(0).second.claimant, "learner/1");
  EXPECT_EQ(t->TrySample(Claiming(1, -1, "learner/0", 2)).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace orrery::replay
