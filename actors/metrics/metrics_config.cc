#include "actors/metrics/metrics_config.h"

#include <fstream>
#include <sstream>

#include "actors/metrics/dashboard_server.h"

namespace orrery {

MetricsConfig ReadMetricsConfig(ConfigTable& root) {
  MetricsConfig c;
  ConfigTable t = root.Table("metrics");
  c.hub_endpoint = t.String("hub_endpoint", c.hub_endpoint);
  if (c.hub_endpoint.find("://") == std::string::npos) {
    t.Fail("hub_endpoint",
           "expected a ZeroMQ endpoint such as tcp://127.0.0.1:5570, got '" + c.hub_endpoint + "'");
  }
  c.http_host = t.String("http_host", c.http_host);
  c.http_port = static_cast<int>(t.Int("http_port", c.http_port, 0, 65535));
  c.token_file = t.Path("token_file", "");
  c.store_dir = t.Path("store_dir", "");
  if (!IsLoopbackHost(c.http_host) && c.token_file.empty()) {
    t.Fail("token_file", "http_host '" + c.http_host +
                             "' is not a loopback address: a bearer token file is required");
  }
  return c;
}

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot read the token file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  const size_t b = token.find_first_not_of(" \t\r\n");
  const size_t e = token.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return InvalidArgumentError(path + ": the token file is empty");
  token = token.substr(b, e - b + 1);
  if (token.find_first_of(" \t\r\n;") != std::string::npos) {
    return InvalidArgumentError(path + ": the token must be one word");
  }
  return token;
}

}  // namespace orrery
