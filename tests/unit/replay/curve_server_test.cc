// The replay store on tcp with the fleet's CURVE keys: a client holding them inserts, sets the
// learner version and deletes; a client without them (or with another fleet's) gets no reply,
// and the store is left as it was: the learner version unchanged, the item not deleted.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "actors/replay/client.h"
#include "actors/replay/server.h"
#include "actors/replay/store.h"
#include "actors/runtime/curve_auth.h"
#include "actors/runtime/curve_keys.h"
#include "actors/runtime/fleet_curve.h"
#include "tests/unit/replay/test_dir.h"

namespace orrery::replay {
namespace {

constexpr char kTable[] = "q";

ReplayConfig Config(const std::string& path) {
  ReplayConfig c;
  c.storage.path = path;
  c.storage.compression = "none";
  TableOptions t;
  t.name = kTable;
  t.sampler = t.remover = {SelectorKind::kFifo, 1.0};
  t.max_size = 16;
  t.limiter = *QueueLimiter(16);
  t.max_staleness = 1000;
  c.tables.push_back(t);
  return c;
}

class ServedStore {
 public:
  explicit ServedStore(const std::string& dir) {
    store_ = std::move(ReplayStore::Open(Config(dir))).value();
    server_ = std::make_unique<ReplayServer>(store_.get(), zmq_);
    bind_ = server_->Bind("tcp://127.0.0.1:*");
    if (bind_.ok())
      thread_ = std::thread([this] { (void)server_->Run([this] { return stop_.load(); }); });
  }
  ~ServedStore() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const Status& bind() const { return bind_; }
  std::string endpoint() const { return server_->endpoint(); }

 private:
  zmq::context_t zmq_;
  std::unique_ptr<ReplayStore> store_;
  std::unique_ptr<ReplayServer> server_;
  Status bind_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(ReplayCurve, StrangersCannotChangeTheStore) {
  ASSERT_TRUE(CheckCurveAvailable().ok());
  const CurveKeyPair keys = *GenerateCurveKeyPair();
  SetFleetCurveKeys(keys);
  TestDir dir;
  ServedStore store(dir.Sub("db"));
  ASSERT_TRUE(store.bind().ok()) << store.bind().ToString();

  auto member = ReplayClient::Connect(store.endpoint(), nullptr, {2000});
  ASSERT_TRUE(member.ok());
  ItemInput item;
  item.group_id = 7;
  item.trajectories = {"t"};
  auto inserted = (*member)->Insert(kTable, item, 2000);
  ASSERT_TRUE(inserted.ok()) << inserted.status().ToString();
  auto version = (*member)->SetLearnerVersion(kTable, 3);
  ASSERT_TRUE(version.ok()) << version.status().ToString();

  const uint64_t before = CurveRefusedTotal();
  for (bool other_fleet : {false, true}) {
    SCOPED_TRACE(other_fleet ? "another fleet's keys" : "no keys");
    SetFleetCurveKeys(other_fleet ? std::optional<CurveKeyPair>(*GenerateCurveKeyPair())
                                  : std::nullopt);
    auto stranger = ReplayClient::Connect(store.endpoint(), nullptr, {500});
    ASSERT_TRUE(stranger.ok());
    auto evict = (*stranger)->SetLearnerVersion(kTable, 1000000);
    EXPECT_FALSE(evict.ok());
    EXPECT_EQ(evict.status().code(), StatusCode::kUnavailable) << evict.status().ToString();
    auto deleted = (*stranger)->UpdatePriorities(kTable, {}, {inserted->key});
    EXPECT_FALSE(deleted.ok());
    EXPECT_FALSE((*stranger)->Info().ok());
  }
  EXPECT_GT(CurveRefusedTotal(), before);

  SetFleetCurveKeys(keys);
  auto info = (*member)->Info();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_EQ(info->size(), 1u);
  EXPECT_EQ((*info)[0].learner_version, 3);
  EXPECT_EQ((*info)[0].size, 1);
  SetFleetCurveKeys(std::nullopt);
}

}  // namespace
}  // namespace orrery::replay
