#include "actors/runtime/advertise.h"

#include <unistd.h>

#include <cstdlib>

namespace orrery {
namespace {

constexpr char kTcp[] = "tcp://";
constexpr char kWildcard[] = "tcp://*:";

}  // namespace

std::string LocalHostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

bool IsWildcardTcp(const std::string& endpoint) { return endpoint.rfind(kWildcard, 0) == 0; }

std::string AdvertisedHost(const std::string& endpoint) {
  if (IsWildcardTcp(endpoint)) {
    const char* env = std::getenv("ORRERY_ADVERTISE_HOST");
    return env != nullptr && env[0] != 0 ? env : LocalHostName();
  }
  if (endpoint.rfind(kTcp, 0) != 0) return "127.0.0.1";  // ipc://, inproc://: this machine
  std::string host = endpoint.substr(sizeof(kTcp) - 1);
  host = host.substr(0, host.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

std::string AdvertisedEndpoint(const std::string& endpoint) {
  if (!IsWildcardTcp(endpoint)) return endpoint;
  return kTcp + AdvertisedHost(endpoint) + endpoint.substr(sizeof(kWildcard) - 2);
}

}  // namespace orrery
