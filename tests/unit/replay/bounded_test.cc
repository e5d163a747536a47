// Bounded under load: parked requests are limited per table and per client (count and payload
// bytes) and refused with ResourceExhausted beyond a limit; replies waiting for a group commit are
// answered with the storage error when the WAL sync fails instead of waiting forever; samples
// read payloads from RocksDB (the table holds no copy of its contents).
#include <gtest/gtest.h>
#include <rocksdb/write_batch.h>

#include <chrono>
#include <map>
#include <thread>

#include "actors/replay/capnp_io.h"
#include "actors/replay/power_loss_fs.h"
#include "actors/replay/service.h"
#include "actors/schema/replay.capnp.h"
#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

constexpr char kTable[] = "q";

ReplayConfig QueueConfig(const std::string& path, int64_t queue_size) {
  ReplayConfig c;
  c.storage.path = path;
  c.storage.compression = "none";
  TableOptions t;
  t.name = kTable;
  t.sampler = t.remover = {SelectorKind::kFifo, 1.0};
  t.max_times_sampled = 1;
  t.max_size = queue_size;
  t.limiter = *QueueLimiter(queue_size);
  c.tables.push_back(t);
  return c;
}

std::string InsertRequest(uint64_t id, uint64_t group, size_t bytes = 16) {
  capnp::MallocMessageBuilder builder;
  auto req = builder.initRoot<schema::ReplayRequest>();
  req.setId(id);
  req.setTimeoutMs(-1);  // parked until served: only the limits bound it
  auto in = req.initInsert();
  in.setTable(kTable);
  in.setGroupId(group);
  in.setTokens(1);
  const std::string payload(bytes, 'x');
  in.initTrajectories(1).set(
      0, kj::ArrayPtr<const kj::byte>(reinterpret_cast<const kj::byte*>(payload.data()), bytes));
  return CapnpToBytes(builder);
}

std::string SampleRequest(uint64_t id) {
  capnp::MallocMessageBuilder builder;
  auto req = builder.initRoot<schema::ReplayRequest>();
  req.setId(id);
  req.setTimeoutMs(0);
  auto in = req.initSample();
  in.setTable(kTable);
  in.setMaxItems(1);
  in.setLearnerVersion(-1);
  in.setBatchStep(-1);
  return CapnpToBytes(builder);
}

// Replies by request id: "" for success, else "<code>: <message>".
class Replies {
 public:
  ReplayService::SendFn Sink() {
    return [this](const std::string&, kj::Array<capnp::word> reply) {
      const auto bytes = reply.asBytes();
      const std::string flat(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
      (void)ReadCapnpMessage<schema::ReplayReply>(flat, "reply", [&](auto r) {
        by_id_[r.getId()] = r.isError() ? std::to_string(r.getError().getCode()) + ": " +
                                              std::string(r.getError().getMessage().cStr())
                                        : "";
        return Status::OK();
      });
    };
  }
  bool has(uint64_t id) const { return by_id_.count(id) > 0; }
  const std::string& at(uint64_t id) const { return by_id_.at(id); }

 private:
  std::map<uint64_t, std::string> by_id_;
};

const std::string kExhausted = std::to_string(static_cast<int>(StatusCode::kResourceExhausted));

TEST(BoundedTest, ParkedRequestsAreLimitedPerTableAndPerClient) {
  TestDir dir;
  ReplayConfig config = QueueConfig(dir.Sub("db"), 1);
  config.max_parked_per_table = 2;
  config.max_parked_per_client = 1;
  config.max_parked_bytes_per_client = 1 << 20;
  auto store = *ReplayStore::Open(config);
  Replies replies;
  ReplayService service(store.get(), replies.Sink());

  service.HandleRequest("a", InsertRequest(1, 1));  // fills the queue of one
  ASSERT_TRUE(replies.has(1));
  EXPECT_EQ(replies.at(1), "");
  service.HandleRequest("a", InsertRequest(2, 2));  // parked: the queue is full
  EXPECT_FALSE(replies.has(2));
  service.HandleRequest("a", InsertRequest(3, 3));  // a's second parked request
  ASSERT_TRUE(replies.has(3));
  EXPECT_EQ(replies.at(3).rfind(kExhausted + ": replay: this client already has 1 parked", 0), 0u)
      << replies.at(3);
  service.HandleRequest("d", InsertRequest(6, 6, 2 << 20));  // more bytes than a client may park
  ASSERT_TRUE(replies.has(6));
  EXPECT_EQ(replies.at(6).rfind(kExhausted + ": replay: an insert of 2097152 bytes", 0), 0u)
      << replies.at(6);
  service.HandleRequest("b", InsertRequest(4, 4));  // parked: the table's second
  EXPECT_FALSE(replies.has(4));
  service.HandleRequest("c", InsertRequest(5, 5));  // the table's third
  ASSERT_TRUE(replies.has(5));
  EXPECT_EQ(replies.at(5).rfind(kExhausted + ": replay table 'q' already has 2 parked", 0), 0u)
      << replies.at(5);
  EXPECT_EQ(service.parked(), 2u);

  // A sample makes room: a's parked insert is stored, and a may park again.
  service.HandleRequest("e", SampleRequest(7));
  EXPECT_EQ(replies.at(7), "");
  ASSERT_TRUE(replies.has(2));
  EXPECT_EQ(replies.at(2), "");
  service.HandleRequest("a", InsertRequest(8, 8));
  EXPECT_FALSE(replies.has(8)) << replies.at(8);
  EXPECT_EQ(service.parked(), 2u);
  service.CancelAll();
}

TEST(BoundedTest, RepliesWaitingForAFailedSyncGetTheStorageError) {
  TestDir dir;
  auto fs = std::make_shared<PowerLossFileSystem>();
  std::unique_ptr<rocksdb::Env> env = NewPowerLossEnv(fs);
  ReplayConfig config = QueueConfig(dir.Sub("db"), 8);
  config.storage.env = env.get();
  config.storage.sync_each_write = false;
  config.storage.group_commit_ms = 300;  // the second insert waits for the next fsync
  auto store = *ReplayStore::Open(config);
  Replies replies;
  ReplayService service(store.get(), replies.Sink());
  auto serve_until = [&](uint64_t id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!replies.has(id) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      service.Poll();
    }
  };
  service.HandleRequest("a", InsertRequest(1, 1));
  serve_until(1);
  ASSERT_TRUE(replies.has(1));
  service.HandleRequest("a", InsertRequest(2, 2));
  EXPECT_FALSE(replies.has(2));
  fs->CutPower();  // the WAL sync that would make insert 2 durable fails
  serve_until(2);
  ASSERT_TRUE(replies.has(2)) << "an insert waiting for a failed WAL sync was never answered";
  EXPECT_NE(replies.at(2).find("power"), std::string::npos) << replies.at(2);
  EXPECT_EQ(replies.at(2).rfind(std::to_string(static_cast<int>(StatusCode::kIoError)), 0), 0u)
      << replies.at(2);
  service.CancelAll();
}

TEST(BoundedTest, SamplesReadThePayloadFromTheDatabase) {
  TestDir dir;
  auto store = *ReplayStore::Open(QueueConfig(dir.Sub("db"), 8));
  Table* t = *store->Find(kTable);
  for (uint64_t g = 1; g <= 2; ++g) {
    ItemInput in;
    in.group_id = g;
    in.tokens = 1;
    in.trajectories = {"payload " + std::to_string(g)};
    ASSERT_TRUE(t->Insert(in, NoDeadline()).ok());
  }
  auto first = t->TrySample({1, -1, -1});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first->at(0).trajectories, std::vector<std::string>{"payload 1"});
  // Remove the second item's payload behind the table's back: a table that kept its own copy
  // would still serve it.
  rocksdb::WriteBatch batch;
  const std::string key = PayloadRecordKey(kTable, t->Items().at(0).first);
  batch.Delete(rocksdb::Slice(key.data(), key.size()));
  ASSERT_TRUE(store->storage()->Write(&batch).ok());
  auto second = t->TrySample({1, -1, -1});
  EXPECT_EQ(second.status().code(), StatusCode::kDataLoss) << second.status().ToString();
  EXPECT_EQ(t->TrySample({1, -1, -1}).status().code(), StatusCode::kFailedPrecondition)
      << "a table that failed to read its database must refuse further calls";
}

}  // namespace
}  // namespace orrery::replay
