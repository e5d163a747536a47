#include "actors/metrics/dashboard_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

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

// A self-signed P-256 certificate for 127.0.0.1, valid for an hour, written as PEM files.
void WriteSelfSignedCertificate(const std::string& cert_path, const std::string& key_path) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  ASSERT_NE(key, nullptr);
  X509* x = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), 0);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  ASSERT_GT(X509_sign(x, key, EVP_sha256()), 0);
  FILE* c = std::fopen(cert_path.c_str(), "w");
  FILE* k = std::fopen(key_path.c_str(), "w");
  ASSERT_TRUE(c != nullptr && k != nullptr);
  EXPECT_EQ(PEM_write_X509(c, x), 1);
  EXPECT_EQ(PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr), 1);
  std::fclose(c);
  std::fclose(k);
  X509_free(x);
  EVP_PKEY_free(key);
}

// Beyond loopback the dashboard needs TLS as well as the token; with a certificate it speaks
// HTTPS only.
TEST_F(DashboardServerTest, TlsIsRequiredBeyondLoopbackAndServed) {
  DashboardServerOptions clear;
  clear.host = "0.0.0.0";
  clear.token = "s3cret";
  auto refused = DashboardServer::Start(store_.get(), nullptr, clear);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("needs TLS (--tls-cert FILE --tls-key FILE)"),
            std::string::npos)
      << refused.status().message();

  char dir[] = "/tmp/orrery-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string cert = std::string(dir) + "/cert.pem", key = std::string(dir) + "/key.pem";
  WriteSelfSignedCertificate(cert, key);
  DashboardServerOptions half;
  half.tls_cert_file = cert;
  EXPECT_FALSE(DashboardServer::Start(store_.get(), nullptr, half).ok());
  DashboardServerOptions swapped;
  swapped.tls_cert_file = key;
  swapped.tls_key_file = cert;
  auto bad = DashboardServer::Start(store_.get(), nullptr, swapped);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot load the certificate"), std::string::npos);

  DashboardServerOptions options;
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  options.token = "s3cret";
  auto server = DashboardServer::Start(store_.get(), nullptr, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->url().compare(0, 8, "https://"), 0) << (*server)->url();
  httplib::SSLClient https("127.0.0.1", (*server)->port());
  https.enable_server_certificate_verification(false);  // self-signed, made above
  auto info = https.Get("/api/info", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(info) << httplib::to_string(info.error());
  EXPECT_EQ(info->status, 200);
  httplib::Client plain("127.0.0.1", (*server)->port());
  plain.set_read_timeout(2, 0);
  auto cleartext = plain.Get("/api/info", {{"Authorization", "Bearer s3cret"}});
  EXPECT_TRUE(!cleartext || cleartext->status != 200) << "the HTTPS port answered plain HTTP";
  std::remove(cert.c_str());
  std::remove(key.c_str());
  rmdir(dir);
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
