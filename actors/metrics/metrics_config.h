// The [metrics] section of a run config: where actors publish metric records and where the hub
// serves the dashboard.
//
//   [metrics]
//   hub_endpoint = "tcp://127.0.0.1:5570"  # the hub binds SUB here; actors' PUB sockets connect
//   http_host = "127.0.0.1"                # anything else needs token_file
//   http_port = 8470                       # 0: any free port
//   token_file = ""                        # file holding the bearer token
//   store_dir = ""                         # default: <run.dir>/metrics_db
#pragma once

#include <string>

#include "core/config.h"

namespace orrery {

struct MetricsConfig {
  std::string hub_endpoint = "tcp://127.0.0.1:5570";
  std::string http_host = "127.0.0.1";
  int http_port = 8470;
  std::string token_file;
  std::string store_dir;
};

// Reads root.[metrics]; absent keys take the defaults above. Errors go to the document.
MetricsConfig ReadMetricsConfig(ConfigTable& root);

// Reads the bearer token from `path` (surrounding whitespace removed); fails when it is empty.
StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace orrery
