#include "actors/metrics/dashboard_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "tests/fixtures/metrics_run_generator.h"

namespace orrery {
namespace {

class DashboardServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MetricsStoreOptions options;
    options.in_memory = true;
    auto store = MetricsStore::Open("/server-test", options);
    ASSERT_TRUE(store.ok());
    store_ = std::move(store).value();
    MetricsFixtureShape shape;
    shape.steps = 4;
    for (const MetricRecord& r : GenerateMetricsRun(shape)) ASSERT_TRUE(store_->Append(r).ok());
  }
  std::unique_ptr<MetricsStore> store_;
  IngestCounters counters_;
};

TEST_F(DashboardServerTest, ServesPageApiAndMetrics) {
  DashboardServerOptions options;
  options.title = "fixture";
  auto server = DashboardServer::Start(store_.get(), &counters_, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string((*server)->port()) + "/");
  httplib::Client client("127.0.0.1", (*server)->port());

  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("<script src=\"/app.js\">"), std::string::npos);
  auto js = client.Get("/app.js");
  ASSERT_TRUE(js);
  EXPECT_EQ(js->status, 200);
  EXPECT_GT(js->body.size(), 10000u);  // uPlot is bundled in
  EXPECT_EQ(js->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(client.Get("/nope.js")->status, 404);

  auto info = nlohmann::json::parse(client.Get("/api/info")->body);
  EXPECT_EQ(info["title"], "fixture");
  EXPECT_EQ(info["records"], store_->records());
  EXPECT_EQ(info["last_seq"], store_->last_seq());

  auto series = nlohmann::json::parse(client.Get("/api/series")->body);
  ASSERT_TRUE(series.is_array());
  EXPECT_EQ(series.size(), store_->ListSeries().size());

  auto q = client.Get("/api/query?name=learner/loss&name=routing/expert_load/layer0");
  ASSERT_TRUE(q);
  ASSERT_EQ(q->status, 200) << q->body;
  auto j = nlohmann::json::parse(q->body);
  ASSERT_EQ(j["series"]["learner/loss"].size(), 1u);
  EXPECT_EQ(j["series"]["learner/loss"][0]["source"], "learner:0");
  EXPECT_EQ(j["series"]["learner/loss"][0]["step"], nlohmann::json({0, 1, 2, 3}));
  EXPECT_EQ(j["series"]["routing/expert_load/layer0"][0]["values"][0].size(), 16u);

  // Incremental: nothing after the last sequence number; `until` bounds the answer.
  const uint64_t last = j["seq"];
  auto after = nlohmann::json::parse(
      client.Get("/api/query?name=learner/loss&after=" + std::to_string(last))->body);
  EXPECT_TRUE(after["series"]["learner/loss"].empty());
  const uint64_t first_loss_seq = j["series"]["learner/loss"][0]["seq"][0];
  auto until = nlohmann::json::parse(
      client.Get("/api/query?name=learner/loss&until=" + std::to_string(first_loss_seq))->body);
  EXPECT_EQ(until["series"]["learner/loss"][0]["seq"].size(), 1u);

  EXPECT_EQ(client.Get("/api/query")->status, 400);
  EXPECT_EQ(client.Get("/api/query?name=x&after=abc")->status, 400);

  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("orrery_learner_loss{actor=\"learner:0\"}"), std::string::npos);
  EXPECT_NE(metrics->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
}

TEST_F(DashboardServerTest, TokenIsRequiredBeyondLoopbackAndEnforced) {
  DashboardServerOptions open;
  open.host = "0.0.0.0";
  auto refused = DashboardServer::Start(store_.get(), nullptr, open);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("bearer token"), std::string::npos);

  DashboardServerOptions options;
  options.token = "s3cret";
  auto server = DashboardServer::Start(store_.get(), nullptr, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  httplib::Client client("127.0.0.1", (*server)->port());
  EXPECT_EQ(client.Get("/metrics")->status, 401);
  EXPECT_EQ(client.Get("/api/series", {{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(client.Get("/metrics", {{"Authorization", "Bearer s3cret"}})->status, 200);
  // A browser without the cookie is sent to the login form; the token in a URL is never taken
  // (it would land in histories, logs and Referer headers), in the query of POST /login neither.
  auto url_token = client.Get("/?token=s3cret");
  ASSERT_TRUE(url_token);
  EXPECT_EQ(url_token->status, 303);
  EXPECT_EQ(url_token->get_header_value("Location"), "/login");
  EXPECT_EQ(url_token->get_header_value("Set-Cookie"), "");
  auto form = client.Get("/login");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 200);
  EXPECT_NE(form->body.find("method=\"post\""), std::string::npos);
  EXPECT_EQ(client.Post("/login?token=s3cret", "", "application/x-www-form-urlencoded")->status,
            401);
  EXPECT_EQ(client.Post("/login", "token=wrong", "application/x-www-form-urlencoded")->status, 401);
  // POST /login with the token in the form body sets the cookie that later requests carry.
  auto login = client.Post("/login", "token=s3cret", "application/x-www-form-urlencoded");
  ASSERT_TRUE(login);
  EXPECT_EQ(login->status, 303);
  EXPECT_NE(login->get_header_value("Set-Cookie").find("orrery_token=s3cret; HttpOnly"),
            std::string::npos);
  EXPECT_EQ(client.Get("/api/info", {{"Cookie", "a=b; orrery_token=s3cret"}})->status, 200);
}

// DNS rebinding: a page of another site whose name was rebound to 127.0.0.1 sends its own name
// as Host. Only the loopback names, the bind address and --allow-host names are served.
TEST_F(DashboardServerTest, OnlyKnownHostNamesAreServed) {
  DashboardServerOptions options;
  options.allowed_hosts = {"Dash.Example.org"};
  auto server = DashboardServer::Start(store_.get(), nullptr, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  httplib::Client client("127.0.0.1", (*server)->port());
  const std::string port = std::to_string((*server)->port());
  for (const std::string& host :
       std::vector<std::string>{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port,
                                "dash.example.org", "dash.example.org:" + port}) {
    auto r = client.Get("/api/info", {{"Host", host}});
    ASSERT_TRUE(r) << host;
    EXPECT_EQ(r->status, 200) << host;
  }
  for (const std::string& host :
       std::vector<std::string>{"evil.example:" + port, "127.0.0.1.evil.example", ""}) {
    auto r = client.Get("/api/info", {{"Host", host}});
    ASSERT_TRUE(r) << host;
    EXPECT_EQ(r->status, 421) << host;
    EXPECT_NE(r->body.find("--allow-host"), std::string::npos) << r->body;
  }
}

TEST(DashboardServerPortTest, BusyPortIsAnError) {
  MetricsStoreOptions options;
  options.in_memory = true;
  auto store = MetricsStore::Open("/port-test", options);
  ASSERT_TRUE(store.ok());
  auto first = DashboardServer::Start(store->get(), nullptr, {});
  ASSERT_TRUE(first.ok());
  DashboardServerOptions same;
  same.port = (*first)->port();
  auto second = DashboardServer::Start(store->get(), nullptr, same);
  EXPECT_FALSE(second.ok());
}

TEST(LoopbackTest, RecognisesLoopbackHosts) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("::"));
}

}  // namespace
}  // namespace orrery
