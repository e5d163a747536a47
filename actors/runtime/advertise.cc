#include "actors/runtime/advertise.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

namespace orrery {
namespace {

constexpr char kTcp[] = "tcp://";
constexpr char kWildcard[] = "tcp://*:";

bool IsPublicIpv4(uint32_t a) {  // host byte order
  const auto in = [a](uint32_t net, int bits) {
    return (a >> (32 - bits)) == (net >> (32 - bits));
  };
  // IANA's special-purpose blocks that are not globally reachable: this network, private, shared,
  // loopback, link-local, IETF protocol assignments, the documentation (TEST-NET) and
  // benchmarking blocks, and the reserved 240/4 with the broadcast address.
  return !(in(0x00000000, 8) || in(0x0A000000, 8) || in(0x64400000, 10) || in(0x7F000000, 8) ||
           in(0xA9FE0000, 16) || in(0xAC100000, 12) || in(0xC0000000, 24) || in(0xC0000200, 24) ||
           in(0xC0A80000, 16) || in(0xC6120000, 15) || in(0xC6336400, 24) || in(0xCB007100, 24) ||
           in(0xF0000000, 4));
}

bool IsPublicIpv6(const in6_addr& a) {
  if (IN6_IS_ADDR_V4MAPPED(&a)) {
    return IsPublicIpv4(static_cast<uint32_t>(a.s6_addr[12]) << 24 |
                        static_cast<uint32_t>(a.s6_addr[13]) << 16 |
                        static_cast<uint32_t>(a.s6_addr[14]) << 8 | a.s6_addr[15]);
  }
  const bool unique_local = (a.s6_addr[0] & 0xFE) == 0xFC;  // fc00::/7
  return !(IN6_IS_ADDR_UNSPECIFIED(&a) || IN6_IS_ADDR_LOOPBACK(&a) || IN6_IS_ADDR_LINKLOCAL(&a) ||
           unique_local);
}

// Calls visit(v4, v6) (one of them null) for each IPv4 and IPv6 address `host` resolves to, until
// it returns false. False when `host` does not resolve.
template <typename Visit>
bool ForEachAddress(const std::string& host, Visit visit) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    bool more = true;
    if (a->ai_family == AF_INET) {
      more = visit(&reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, nullptr);
    } else if (a->ai_family == AF_INET6) {
      more = visit(nullptr, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
    }
    if (!more) break;
  }
  freeaddrinfo(res);
  return true;
}

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

std::string PublicAddressOf(const std::string& host) {
  std::string found;
  ForEachAddress(host, [&](const in_addr* v4, const in6_addr* v6) {
    char text[INET6_ADDRSTRLEN] = {0};
    if (v4 != nullptr && IsPublicIpv4(ntohl(v4->s_addr))) {
      inet_ntop(AF_INET, v4, text, sizeof(text));
    } else if (v6 != nullptr && IsPublicIpv6(*v6)) {
      inet_ntop(AF_INET6, v6, text, sizeof(text));
    }
    found = text;
    return found.empty();
  });
  return found;
}

bool ResolvesOnlyToLoopback(const std::string& host) {
  bool only_loopback = true;
  const bool resolved = ForEachAddress(host, [&](const in_addr* v4, const in6_addr* v6) {
    only_loopback &= v4 != nullptr ? (ntohl(v4->s_addr) >> 24) == 127 : IN6_IS_ADDR_LOOPBACK(v6);
    return true;
  });
  return resolved && only_loopback;
}

std::string AdvertisedEndpoint(const std::string& endpoint) {
  if (!IsWildcardTcp(endpoint)) return endpoint;
  return kTcp + AdvertisedHost(endpoint) + endpoint.substr(sizeof(kWildcard) - 2);
}

}  // namespace orrery
