#include "actors/metrics/metrics_hub.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <zmq.hpp>

#include "actors/metrics/metrics_publisher.h"
#include "actors/runtime/fleet_curve.h"
#include "tests/unit/metrics/test_dir.h"

namespace orrery {
namespace {

MetricRecord Step(int64_t step) {
  MetricRecord r;
  r.time = 1000.0 + step;
  r.source = "learner:0";
  r.step = step;
  r.scalars["learner/loss"] = 1.0 / (1 + step);
  return r;
}

// Publishes step after step until the hub has stored `want` records (PUB drops messages until
// the subscription has propagated), bounded in time.
bool PublishUntilStored(MetricsPublisher& pub, const MetricsHub& hub, uint64_t want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int64_t step = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (hub.store().records() >= want) return true;
    EXPECT_TRUE(pub.Publish(Step(step++)).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(MetricsHubTest, StoresPublishedRecordsDurablyAndWritesTheFile) {
  TestDir dir;
  MetricsHubOptions options;
  options.store_dir = dir / "metrics_db";
  options.listen = {"tcp://127.0.0.1:*"};
  uint64_t stored = 0;
  {
    auto hub = MetricsHub::Start(options);
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    ASSERT_EQ((*hub)->bound_endpoints().size(), 1u);
    const std::string endpoint = (*hub)->bound_endpoints()[0];
    EXPECT_NE(endpoint.find("tcp://127.0.0.1:"), std::string::npos);

    MetricsPublisherOptions pub_options;
    pub_options.file = dir / "metrics.jsonl";
    pub_options.endpoint = endpoint;
    auto pub = MetricsPublisher::Open(pub_options);
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    ASSERT_TRUE(PublishUntilStored(**pub, **hub, 5));

    // A message that is not a record is counted, not stored.
    zmq::context_t ctx(1);
    zmq::socket_t raw(ctx, zmq::socket_type::pub);
    raw.connect(endpoint);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((*hub)->counters().rejected.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      raw.send(zmq::str_buffer("not json"), zmq::send_flags::dontwait);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_GT((*hub)->counters().rejected.load(), 0u);
    raw.close();
    (*hub)->Stop();
    stored = (*hub)->store().records();
    EXPECT_EQ((*hub)->counters().received.load(), stored);

    // Every published record is in the file, received or not.
    auto file = ReadMetricsFile(dir / "metrics.jsonl");
    ASSERT_TRUE(file.ok());
    EXPECT_GE(file->size(), stored);
  }
  // A restarted hub has the same series.
  auto store = MetricsStore::Open(dir / "metrics_db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->records(), stored);
  auto q = (*store)->Query("learner/loss");
  ASSERT_TRUE(q.ok());
  ASSERT_EQ(q->size(), 1u);
  EXPECT_EQ((*q)[0].points.size(), stored);
}

// On tcp with the fleet's keys (every fleet process has them), the hub takes records from members
// only: a stranger's PUB, plain or with a keypair of its own, never reaches the store, so nobody
// outside the fleet can write a series into the dashboard (issue 28).
TEST(MetricsHubTest, WithTheFleetsKeysOnlyMembersPublish) {
  TestDir dir;
  StatusOr<CurveKeyPair> fleet = GenerateCurveKeyPair();
  ASSERT_TRUE(fleet.ok());
  SetFleetCurveKeys(*fleet);
  MetricsHubOptions options;
  options.store_dir = dir / "metrics_db";
  options.listen = {"tcp://127.0.0.1:*"};
  auto hub = MetricsHub::Start(options);
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  const std::string endpoint = (*hub)->bound_endpoints()[0];

  // Strangers first, for long enough that a plain peer's records would have been stored.
  MetricRecord injected;
  injected.time = 5000;
  injected.source = "stranger:0";
  injected.scalars["stranger/injected"] = 1.0;
  const std::string line = injected.ToJson();
  zmq::context_t ctx(1);
  zmq::socket_t plain(ctx, zmq::socket_type::pub);
  plain.set(zmq::sockopt::linger, 0);
  plain.connect(endpoint);
  zmq::socket_t own_keys(ctx, zmq::socket_type::pub);
  own_keys.set(zmq::sockopt::linger, 0);
  const CurveKeyPair stranger = GenerateCurveKeyPair().value();
  own_keys.set(zmq::sockopt::curve_serverkey, fleet->public_key);
  own_keys.set(zmq::sockopt::curve_publickey, stranger.public_key);
  own_keys.set(zmq::sockopt::curve_secretkey, stranger.secret_key);
  own_keys.connect(endpoint);
  for (int i = 0; i < 75; ++i) {
    plain.send(zmq::buffer(line), zmq::send_flags::dontwait);
    own_keys.send(zmq::buffer(line), zmq::send_flags::dontwait);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A member (a CURVE client with the fleet's keys, as MetricsPublisher is in a fleet process).
  MetricsPublisherOptions pub_options;
  pub_options.endpoint = endpoint;
  auto pub = MetricsPublisher::Open(pub_options);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  ASSERT_TRUE(PublishUntilStored(**pub, **hub, 3)) << "the member's records did not arrive";
  (*hub)->Stop();
  auto q = (*hub)->store().Query("stranger/injected");
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(q->empty()) << "a stranger's record was stored";
  EXPECT_EQ((*hub)->counters().rejected.load(), 0u) << "a stranger's message reached the hub";
  SetFleetCurveKeys(std::nullopt);
}

TEST(MetricsHubTest, BadEndpointIsAClearError) {
  TestDir dir;
  MetricsHubOptions options;
  options.store_dir = dir / "db";
  options.listen = {"nonsense"};
  auto hub = MetricsHub::Start(options);
  ASSERT_FALSE(hub.ok());
  EXPECT_NE(hub.status().message().find("endpoint"), std::string::npos);
  options.listen.clear();
  EXPECT_FALSE(MetricsHub::Start(options).ok());
}

}  // namespace
}  // namespace orrery
