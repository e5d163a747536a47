#include "actors/launch/plan.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

namespace orrery {
namespace {

namespace fs = std::filesystem;

// "tcp://host:port" -> host, port.
bool SplitTcp(const std::string& endpoint, std::string* host, int* port) {
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return false;
  *host = rest.substr(0, colon);
  try {
    *port = std::stoi(rest.substr(colon + 1));
  } catch (...) {
    return false;
  }
  return true;
}

Status CheckTcp(const std::string& what, const std::string& endpoint) {
  std::string host;
  int port = 0;
  if (!SplitTcp(endpoint, &host, &port)) {
    return InvalidArgumentError(what + ": '" + endpoint + "' is not tcp://HOST:PORT");
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string bind_host = host == "*" ? "0.0.0.0" : host;
  if (int rc = getaddrinfo(bind_host.c_str(), std::to_string(port).c_str(), &hints, &res);
      rc != 0) {
    return UnavailableError(what + ": cannot resolve host '" + host + "' of " + endpoint + ": " +
                            gai_strerror(rc));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int err = 0;
  if (fd < 0) {
    err = errno;
  } else {
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) err = errno;
    close(fd);
  }
  freeaddrinfo(res);
  if (err == EADDRINUSE) {
    return UnavailableError(what + ": port " + std::to_string(port) + " of " + endpoint +
                            " is already in use");
  }
  if (err == EADDRNOTAVAIL) {
    return UnavailableError(what + ": " + host + " (" + endpoint +
                            ") is not an address of this machine (unreachable here)");
  }
  if (err != 0) return ErrnoError(what + ": cannot bind " + endpoint, err);
  return Status::OK();
}

Status CheckIpc(const std::string& what, const std::string& endpoint) {
  const std::string path = endpoint.substr(6);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError(what + ": socket path " + path + " is longer than " +
                                std::to_string(sizeof(addr.sun_path) - 1) +
                                " bytes (choose a shorter run.dir)");
  }
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return IoError(what + ": cannot create " + fs::path(path).parent_path().string());
  if (fs::exists(path)) {
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool listening =
        fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (fd >= 0) close(fd);
    if (listening) {
      return UnavailableError(what + ": " + endpoint +
                              " is in use (is another fleet running with this run.dir?)");
    }
    fs::remove(path, ec);  // a stale socket of a fleet that was killed
  }
  return Status::OK();
}

}  // namespace

std::string ShellQuote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789_-./:=@%+,") == std::string::npos) {
    return arg;
  }
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

StatusOr<FleetPlan> BuildFleetPlan(const FleetConfig& fleet, const RunConfig& run,
                                   const std::string& config_path,
                                   const std::string& orrery_binary) {
  FleetPlan plan;
  std::error_code ec;
  plan.run_dir = fs::absolute(run.dir, ec).lexically_normal().string();
  plan.coordinator = fleet.coordinator;
  if (plan.coordinator.rfind("ipc://", 0) == 0) {
    plan.coordinator =
        "ipc://" + fs::absolute(plan.coordinator.substr(6), ec).lexically_normal().string();
  }
  const std::string config = fs::absolute(config_path, ec).lexically_normal().string();
  if (FleetUsesTcp(fleet)) plan.curve_key_dir = FleetCurveKeyDir(fleet, run);
  std::set<int> used_ports;
  std::string coord_host;
  int coord_port = 0;
  if (SplitTcp(plan.coordinator, &coord_host, &coord_port)) used_ports.insert(coord_port);
  for (const FleetRoleConfig& r : fleet.roles) {
    if (r.port > 0) {
      for (int i = 0; i < r.count; ++i) {
        if (!used_ports.insert(r.port + i).second) {
          return InvalidArgumentError("fleet.roles (" + r.role + "): port " +
                                      std::to_string(r.port + i) + " is used twice in the plan");
        }
      }
    }
  }
  int next_port = fleet.base_port + 1;
  for (const FleetRoleConfig& r : fleet.roles) {
    for (int i = 0; i < r.count; ++i) {
      ProcessSpec p;
      p.role = r.role;
      p.index = i;
      p.name = r.role + ":" + std::to_string(i);
      p.restart = r.restart;
      if (fleet.transport == "tcp") {
        int port = r.port > 0 ? r.port + i : 0;
        if (port == 0) {
          while (used_ports.count(next_port)) ++next_port;
          port = next_port++;
          used_ports.insert(port);
        }
        if (port > 65535) return InvalidArgumentError("fleet: ran out of tcp ports for " + p.name);
        p.endpoint = "tcp://" + fleet.host + ":" + std::to_string(port);
      } else {
        p.endpoint =
            "ipc://" + plan.run_dir + "/fleet/" + r.role + "-" + std::to_string(i) + ".sock";
      }
      p.argv = {orrery_binary,
                "actor",
                r.role,
                "--index",
                std::to_string(i),
                "--endpoint",
                p.endpoint,
                "--coordinator",
                plan.coordinator,
                "--config",
                config,
                "--run-dir",
                plan.run_dir,
                "--heartbeat-ms",
                std::to_string(fleet.heartbeat_ms),
                "--progress-timeout-ms",
                std::to_string(fleet.progress_timeout_ms),
                "--max-message-mb",
                std::to_string(fleet.max_message_mb)};
      if (!plan.curve_key_dir.empty()) {
        p.argv.push_back("--curve-key-dir");
        p.argv.push_back(plan.curve_key_dir);
      }
      plan.processes.push_back(std::move(p));
    }
  }
  return plan;
}

std::string FormatFleetPlan(const FleetPlan& plan) {
  std::ostringstream out;
  out << "coordinator  " << plan.coordinator << "\n";
  out << "run dir      " << plan.run_dir << "\n";
  if (!plan.curve_key_dir.empty()) out << "curve keys   " << plan.curve_key_dir << "\n";
  out << plan.processes.size() << " actor processes:\n";
  size_t name_w = 8, ep_w = 8;
  for (const ProcessSpec& p : plan.processes) {
    name_w = std::max(name_w, p.name.size());
    ep_w = std::max(ep_w, p.endpoint.size());
  }
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size() + 2, ' '); };
  out << pad("ACTOR", name_w) << pad("ENDPOINT", ep_w) << pad("RESTART", 10) << "COMMAND\n";
  for (const ProcessSpec& p : plan.processes) {
    std::string cmd;
    for (const std::string& a : p.argv) cmd += (cmd.empty() ? "" : " ") + ShellQuote(a);
    const char* restart = p.restart == RestartPolicy::kAlways      ? "always"
                          : p.restart == RestartPolicy::kOnFailure ? "on-failure"
                                                                   : "never";
    out << pad(p.name, name_w) << pad(p.endpoint, ep_w) << pad(restart, 10) << cmd << "\n";
  }
  return out.str();
}

Status PreflightFleet(const FleetPlan& plan) {
  auto check = [](const std::string& what, const std::string& endpoint) {
    if (endpoint.rfind("tcp://", 0) == 0) return CheckTcp(what, endpoint);
    if (endpoint.rfind("ipc://", 0) == 0) return CheckIpc(what, endpoint);
    return InvalidArgumentError(what + ": '" + endpoint + "' is neither ipc:// nor tcp://");
  };
  ORRERY_RETURN_IF_ERROR(check("fleet.coordinator", plan.coordinator));
  for (const ProcessSpec& p : plan.processes) {
    ORRERY_RETURN_IF_ERROR(check("actor " + p.name, p.endpoint));
  }
  return Status::OK();
}

}  // namespace orrery
