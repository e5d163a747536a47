// Idempotent inserts: an insert retried with the same idempotency key is answered with the first
// insert's outcome and stores the group once: after the store committed and "crashed before
// replying" (reopened from disk), after the first item was sampled away, while the rate limiter
// refuses inserts, and for a request the wire delivered twice (ReplayService), also before the
// first one's group commit is durable. Keys are per group and bounded by idempotency_window.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "actors/replay/capnp_io.h"
#include "actors/replay/service.h"
#include "actors/schema/replay.capnp.h"
#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

ItemInput Keyed(uint64_t group, const std::string& key) {
  ItemInput in;
  in.group_id = group;
  in.tokens = 1;
  in.trajectories = {"payload of group " + std::to_string(group)};
  in.idempotency_key = key;
  return in;
}

ReplayConfig Config(const std::string& path, bool per_insert = true) {
  ReplayConfig c;
  c.storage.path = path;
  c.storage.sync_each_write = per_insert;
  c.storage.group_commit_ms = 20;
  TableOptions t;
  t.name = "q";
  t.sampler = t.remover = {SelectorKind::kFifo, 1.0};
  t.max_times_sampled = 1;
  t.max_size = 4;
  t.limiter = *QueueLimiter(4);
  t.idempotency_window = 3;
  c.tables.push_back(t);
  return c;
}

StatusOr<InsertOutcome> Insert(ReplayStore& store, ItemInput in) {
  return (*store.Find("q"))->Insert(std::move(in), DeadlineFromTimeoutMs(0));
}

TEST(IdempotencyTest, ARetryAfterACrashBeforeTheReplyStoresTheGroupOnce) {
  TestDir dir;
  uint64_t first_key = 0;
  {
    auto store = *ReplayStore::Open(Config(dir.Sub("db")));
    StatusOr<InsertOutcome> first = Insert(*store, Keyed(7, "group/7"));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_FALSE(first->duplicate);
    first_key = first->key;
  }  // committed; the reply never left: the producer retries against the restarted store
  auto store = *ReplayStore::Open(Config(dir.Sub("db")));
  Table* t = *store->Find("q");
  StatusOr<InsertOutcome> retry = Insert(*store, Keyed(7, "group/7"));
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(retry->key, first_key);
  EXPECT_EQ(t->Info().size, 1);
  EXPECT_EQ(t->Info().counters.inserts, 1);

  // Sampled away (a queue deletes what it serves): a late retry still does not store it again.
  ASSERT_EQ(t->TrySample({1, -1, -1})->size(), 1u);
  retry = Insert(*store, Keyed(7, "group/7"));
  ASSERT_TRUE(retry.ok());
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(t->Info().size, 0);
  EXPECT_EQ(t->Info().counters.inserts, 1);

  // A key names one group.
  EXPECT_EQ(Insert(*store, Keyed(8, "group/7")).status().code(), StatusCode::kInvalidArgument);
}

TEST(IdempotencyTest, RetriesAreAnsweredWhileTheLimiterRefusesInserts) {
  TestDir dir;
  auto store = *ReplayStore::Open(Config(dir.Sub("db")));
  for (uint64_t g = 1; g <= 4; ++g)
    ASSERT_TRUE(Insert(*store, Keyed(g, "k" + std::to_string(g))).ok());
  EXPECT_EQ(Insert(*store, Keyed(5, "k5")).status().code(), StatusCode::kDeadlineExceeded);
  StatusOr<InsertOutcome> retry = Insert(*store, Keyed(4, "k4"));  // the queue is full
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(retry->key, 4u);
}

TEST(IdempotencyTest, TheWindowKeepsTheMostRecentKeysAcrossRestarts) {
  TestDir dir;
  {
    auto store = *ReplayStore::Open(Config(dir.Sub("db")));
    for (uint64_t g = 1; g <= 4; ++g) {
      ASSERT_TRUE(Insert(*store, Keyed(g, "k" + std::to_string(g))).ok());
    }
  }
  auto store = *ReplayStore::Open(Config(dir.Sub("db")));
  Table* t = *store->Find("q");
  ASSERT_EQ(t->TrySample({4, -1, -1})->size(), 4u);
  for (uint64_t g = 2; g <= 4; ++g) {  // window 3: k2..k4 are remembered
    EXPECT_TRUE(Insert(*store, Keyed(g, "k" + std::to_string(g)))->duplicate) << g;
  }
  StatusOr<InsertOutcome> forgotten = Insert(*store, Keyed(1, "k1"));
  ASSERT_TRUE(forgotten.ok());
  EXPECT_FALSE(forgotten->duplicate);  // older than the window: stored again
  EXPECT_EQ(t->Info().counters.inserts, 5);
}

std::string InsertRequest(uint64_t id, uint64_t group, const std::string& key) {
  capnp::MallocMessageBuilder builder;
  auto req = builder.initRoot<schema::ReplayRequest>();
  req.setId(id);
  req.setTimeoutMs(0);
  auto in = req.initInsert();
  in.setTable("q");
  in.setGroupId(group);
  in.setTokens(1);
  const std::string payload = "payload";
  in.initTrajectories(1).set(
      0, capnp::Data::Reader(reinterpret_cast<const kj::byte*>(payload.data()), payload.size()));
  in.setIdempotencyKey(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(key.data()), key.size()));
  return CapnpToBytes(builder);
}

struct InsertAnswer {
  uint64_t id = 0, key = 0;
  bool duplicate = false;
};

InsertAnswer ReadAnswer(const kj::Array<capnp::word>& reply) {
  InsertAnswer a;
  Status s = ReadCapnpMessage<schema::ReplayReply>(
      std::string_view(reinterpret_cast<const char*>(reply.begin()), reply.asBytes().size()),
      "reply", [&](schema::ReplayReply::Reader r) -> Status {
        if (!r.isInsert()) return InternalError("not an insert reply");
        a.id = r.getId();
        a.key = r.getInsert().getKey();
        a.duplicate = r.getInsert().getDuplicate();
        return Status::OK();
      });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return a;
}

// A request the wire delivers twice, the second before the first's group commit is durable: both
// are answered once durable, with the same key, and the group is stored once.
TEST(IdempotencyTest, ADuplicatedRequestIsAnsweredWithTheFirstResult) {
  TestDir dir;
  auto store = *ReplayStore::Open(Config(dir.Sub("db"), /*per_insert=*/false));
  std::vector<InsertAnswer> answers;
  ReplayService service(store.get(), [&](const std::string&, kj::Array<capnp::word> reply) {
    answers.push_back(ReadAnswer(reply));
  });
  const std::string request = InsertRequest(1, 42, "group/42");
  service.HandleRequest("peer", request);
  service.HandleRequest("peer", request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (answers.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    service.Poll();
  }
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].key, answers[1].key);
  EXPECT_FALSE(answers[0].duplicate);
  EXPECT_TRUE(answers[1].duplicate);
  EXPECT_EQ((*store->Find("q"))->Info().size, 1);
  EXPECT_GE(store->storage()->durable_ticket(), 1u);
}

}  // namespace
}  // namespace orrery::replay
