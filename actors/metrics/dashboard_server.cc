#include "actors/metrics/dashboard_server.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>

#include "actors/dashboard/dashboard_assets.h"
#include "core/logging.h"

namespace orrery {
namespace {

// Compares in time independent of where the strings differ.
bool TokenEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

std::string CookieValue(const std::string& header, const std::string& name) {
  size_t pos = 0;
  while (pos < header.size()) {
    size_t end = header.find(';', pos);
    if (end == std::string::npos) end = header.size();
    std::string item = header.substr(pos, end - pos);
    while (!item.empty() && item[0] == ' ') item.erase(0, 1);
    if (item.compare(0, name.size() + 1, name + "=") == 0) return item.substr(name.size() + 1);
    pos = end + 1;
  }
  return "";
}

void SendJson(httplib::Response& res, const nlohmann::json& j) {
  res.set_header("Cache-Control", "no-store");
  res.set_content(j.dump(), "application/json");
}

void SendError(httplib::Response& res, int code, const std::string& message) {
  res.status = code;
  res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
}

// The Host header's name without its port, lower-cased: "[::1]:8080" -> "[::1]".
std::string HostName(const std::string& header) {
  std::string name = header;
  if (!name.empty() && name[0] == '[') {
    const size_t end = name.find(']');
    if (end != std::string::npos) name.resize(end + 1);
  } else if (const size_t colon = name.rfind(':'); colon != std::string::npos) {
    name.resize(colon);
  }
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

// The value of `key` in an application/x-www-form-urlencoded body ("" when absent or malformed).
std::string FormValue(const std::string& body, const std::string& key) {
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t end = body.find('&', pos);
    if (end == std::string::npos) end = body.size();
    const std::string item = body.substr(pos, end - pos);
    if (item.compare(0, key.size() + 1, key + "=") == 0) {
      std::string out;
      for (size_t i = key.size() + 1; i < item.size(); ++i) {
        if (item[i] == '+') {
          out += ' ';
        } else if (item[i] == '%' && i + 2 < item.size() &&
                   std::isxdigit(static_cast<unsigned char>(item[i + 1])) &&
                   std::isxdigit(static_cast<unsigned char>(item[i + 2]))) {
          out += static_cast<char>(std::stoi(item.substr(i + 1, 2), nullptr, 16));
          i += 2;
        } else if (item[i] == '%') {
          return "";
        } else {
          out += item[i];
        }
      }
      return out;
    }
    pos = end + 1;
  }
  return "";
}

constexpr const char* kLoginPage =
    "<!doctype html><meta charset=\"utf-8\"><title>Orrery dashboard</title>"
    "<form method=\"post\" action=\"/login\"><label>Token <input name=\"token\" "
    "type=\"password\" autofocus></label> <button>Open the dashboard</button></form>\n";

bool ParseUnsigned(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 19) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.compare(0, 4, "127.") == 0;
}

StatusOr<std::unique_ptr<DashboardServer>> DashboardServer::Start(
    const MetricsStore* store, const IngestCounters* counters,
    const DashboardServerOptions& options) {
  if (!IsLoopbackHost(options.host) && options.token.empty()) {
    return InvalidArgumentError("binding the dashboard to " + options.host +
                                " needs a bearer token (--token-file FILE)");
  }
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (tls && (options.tls_cert_file.empty() || options.tls_key_file.empty())) {
    return InvalidArgumentError("dashboard TLS needs both --tls-cert FILE and --tls-key FILE");
  }
  if (!IsLoopbackHost(options.host) && !tls) {
    return InvalidArgumentError("binding the dashboard to " + options.host +
                                " needs TLS (--tls-cert FILE --tls-key FILE): beyond loopback the "
                                "token and the charts would cross the network in the clear");
  }
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("dashboard port " + std::to_string(options.port) +
                                ": expected 0..65535");
  }
  std::unique_ptr<DashboardServer> self(new DashboardServer());
  if (tls) {
    auto ssl = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(),
                                                    options.tls_key_file.c_str());
    if (!ssl->is_valid()) {
      return InvalidArgumentError("dashboard TLS: cannot load the certificate " +
                                  options.tls_cert_file + " with the key " + options.tls_key_file +
                                  " (PEM files, the key matching the certificate)");
    }
    self->server_ = std::move(ssl);
  } else {
    self->server_ = std::make_unique<httplib::Server>();
  }
  self->tls_ = tls;
  self->host_ = options.host;
  httplib::Server& svr = *self->server_;
  // SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT, which would let a second
  // server bind the same port and silently take half of its requests.
  svr.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  // Every request: its Host first (DNS rebinding), then, with a token, its credentials: the
  // Authorization header or the cookie that POST /login sets. The token is never taken from a
  // URL, where it would land in histories, logs and Referer headers.
  std::vector<std::string> hosts;
  const bool wildcard = options.host == "0.0.0.0" || options.host == "::";
  if (!wildcard || !options.allowed_hosts.empty()) {
    hosts = {"localhost", "127.0.0.1", "[::1]"};
    if (!wildcard) {
      hosts.push_back(HostName(
          options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host));
    }
    for (const std::string& h : options.allowed_hosts) hosts.push_back(HostName(h));
  }
  const std::string token = options.token;
  svr.set_pre_routing_handler([token, hosts](const httplib::Request& req, httplib::Response& res) {
    if (!hosts.empty()) {
      const std::string host = HostName(req.get_header_value("Host"));
      if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) {
        SendError(res, 421,
                  "Host '" + req.get_header_value("Host") +
                      "' is not served here (dashboard --allow-host NAME adds one)");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (token.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path == "/login") return httplib::Server::HandlerResponse::Unhandled;  // below
    const std::string auth = req.get_header_value("Authorization");
    if (auth.compare(0, 7, "Bearer ") == 0 && TokenEquals(auth.substr(7), token)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (TokenEquals(CookieValue(req.get_header_value("Cookie"), "orrery_token"), token)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (req.method == "GET" && (req.path == "/" || req.path == "/index.html")) {
      res.status = 303;  // a browser without the cookie: the login form
      res.set_header("Location", "/login");
      return httplib::Server::HandlerResponse::Handled;
    }
    res.set_header("WWW-Authenticate", "Bearer");
    SendError(res, 401, "missing or wrong bearer token");
    return httplib::Server::HandlerResponse::Handled;
  });

  if (!token.empty()) {
    // The login form, and its POST (the body is read only after pre-routing, so here).
    const auto login_page = [](httplib::Response& res, int status) {
      res.status = status;
      res.set_header("Cache-Control", "no-store");
      res.set_content(kLoginPage, "text/html; charset=utf-8");
    };
    svr.Get("/login", [login_page](const httplib::Request&, httplib::Response& res) {
      login_page(res, 200);
    });
    svr.Post("/login", [token, login_page](const httplib::Request& req, httplib::Response& res) {
      if (!TokenEquals(FormValue(req.body, "token"), token)) return login_page(res, 401);
      res.set_header("Set-Cookie", "orrery_token=" + token + "; HttpOnly; SameSite=Strict; Path=/");
      res.status = 303;
      res.set_header("Location", "/");
    });
  }

  auto serve_asset = [](const std::string& path, httplib::Response& res) {
    const DashboardAsset* asset = FindDashboardAsset(path);
    if (asset == nullptr) {
      SendError(res, 404, "no such page: " + path);
      return;
    }
    res.set_content(reinterpret_cast<const char*>(asset->data), asset->size, asset->content_type);
  };
  svr.Get("/", [serve_asset](const httplib::Request&, httplib::Response& res) {
    serve_asset("/index.html", res);
  });
  svr.Get(R"(/(app\.js|app\.css|index\.html))",
          [serve_asset](const httplib::Request& req, httplib::Response& res) {
            serve_asset(req.path, res);
          });
  svr.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });

  const std::string title = options.title;
  svr.Get("/api/info", [store, title](const httplib::Request&, httplib::Response& res) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    SendJson(res, {{"title", title},
                   {"now", now},
                   {"last_seq", store->last_seq()},
                   {"records", store->records()},
                   {"series", store->ListSeries().size()},
                   {"actors", store->ListSources().size()}});
  });
  svr.Get("/api/series", [store](const httplib::Request&, httplib::Response& res) {
    nlohmann::json out = nlohmann::json::array();
    for (const SeriesInfo& s : store->ListSeries()) {
      out.push_back({{"name", s.name},
                     {"source", s.source},
                     {"array", s.is_array},
                     {"points", s.points},
                     {"last_step", s.last.step},
                     {"last_time", s.last.time}});
    }
    SendJson(res, out);
  });
  svr.Get("/api/actors", [store](const httplib::Request&, httplib::Response& res) {
    nlohmann::json out = nlohmann::json::array();
    for (const SourceInfo& s : store->ListSources()) {
      out.push_back({{"source", s.source},
                     {"first_time", s.first_time},
                     {"last_time", s.last_time},
                     {"records", s.records},
                     {"last_step", s.last_step}});
    }
    SendJson(res, out);
  });
  svr.Get("/api/query", [store](const httplib::Request& req, httplib::Response& res) {
    uint64_t after = 0;
    uint64_t max_points = 5000;
    if (req.has_param("after") && !ParseUnsigned(req.get_param_value("after"), &after)) {
      return SendError(res, 400, "after: expected a sequence number");
    }
    if (req.has_param("max_points") &&
        (!ParseUnsigned(req.get_param_value("max_points"), &max_points) || max_points < 2)) {
      return SendError(res, 400, "max_points: expected an integer >= 2");
    }
    const size_t count = req.get_param_value_count("name");
    if (count == 0) return SendError(res, 400, "name: give at least one series name");
    // Points up to `until` (default: the last one now), so that a client polling with
    // after = previous until never gets a point twice nor skips one.
    uint64_t seq = store->last_seq();
    if (req.has_param("until")) {
      uint64_t until = 0;
      if (!ParseUnsigned(req.get_param_value("until"), &until)) {
        return SendError(res, 400, "until: expected a sequence number");
      }
      seq = std::min(seq, until);
    }
    nlohmann::json series = nlohmann::json::object();
    for (size_t i = 0; i < count; ++i) {
      const std::string name = req.get_param_value("name", i);
      StatusOr<std::vector<SourceSeries>> q = store->Query(name, after, max_points);
      if (!q.ok()) return SendError(res, 500, q.status().ToString());
      nlohmann::json per_source = nlohmann::json::array();
      for (const SourceSeries& s : *q) {
        nlohmann::json seqs = nlohmann::json::array(), times = nlohmann::json::array(),
                       steps = nlohmann::json::array(), values = nlohmann::json::array();
        for (const MetricPoint& p : s.points) {
          if (p.seq > seq) continue;
          seqs.push_back(p.seq);
          times.push_back(p.time);
          steps.push_back(p.step);
          values.push_back(p.values);
        }
        per_source.push_back({{"source", s.source},
                              {"seq", seqs},
                              {"time", times},
                              {"step", steps},
                              {"values", values}});
      }
      series[name] = per_source;
    }
    SendJson(res, {{"seq", seq}, {"series", series}});
  });
  svr.Get("/metrics", [store, counters](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderPrometheusText(*store, counters),
                    "text/plain; version=0.0.4; charset=utf-8");
  });

  self->port_ = options.port == 0
                    ? svr.bind_to_any_port(options.host)
                    : (svr.bind_to_port(options.host, options.port) ? options.port : -1);
  if (self->port_ <= 0) {
    return UnavailableError("dashboard: cannot listen on " + options.host + ":" +
                            std::to_string(options.port) + " (address in use or not local?)");
  }
  self->thread_ = std::thread([srv = self->server_.get()] { srv->listen_after_bind(); });
  // cpp-httplib 0.11 has no wait_until_ready(): poll is_running().
  for (int i = 0; i < 500 && !svr.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!svr.is_running()) {
    self->Stop();
    return UnavailableError("dashboard: the HTTP server did not start");
  }
  return self;
}

std::string DashboardServer::url() const {
  const std::string host = host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_;
  return (tls_ ? "https://" : "http://") + host + ":" + std::to_string(port_) + "/";
}

void DashboardServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

DashboardServer::~DashboardServer() { Stop(); }

}  // namespace orrery
