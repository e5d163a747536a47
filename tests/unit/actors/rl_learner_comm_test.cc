// The learner ranks' communicator (actors/rl/learner_comm.h): two Gloo ranks as two processes,
// listening on the address their actor advertises, checked on their sockets themselves. In a tcp
// fleet that is fleet.host (here a non-loopback address of this machine, the way ranks on two
// nodes must listen), in an ipc fleet 127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "actors/rl/learner_comm.h"
#include "actors/runtime/advertise.h"
#include "tests/unit/forked_ranks.h"

namespace orrery::rl_actors {
namespace {

// The first IPv4 address of an interface that is up and not loopback; "" when there is none.
std::string NonLoopbackIpv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {0};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  freeifaddrs(list);
  return found;
}

// This process's IPv4 TCP sockets ("LOCAL -> REMOTE", addresses without ports): the entries of
// /proc/net/tcp whose inode is one of this process's socket descriptors.
std::set<std::string> TcpSockets() {
  std::set<std::string> inodes;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  auto address = [](const std::string& hex_ip_port) {  // "0202000C:1F90", little-endian
    in_addr addr{};
    addr.s_addr = static_cast<in_addr_t>(std::stoul(hex_ip_port.substr(0, 8), nullptr, 16));
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &addr, text, sizeof(text));
    return std::string(text);
  };
  std::set<std::string> sockets;
  std::ifstream tcp("/proc/self/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
        inode;
    if (inodes.count(inode)) sockets.insert(address(local) + " -> " + address(remote));
  }
  return sockets;
}

// Runs two learner ranks with `endpoint` as forked processes: each joins, checks that its Gloo
// sockets run between `want` and `want` only, and all-reduces. Returns each rank's exit code (0:
// passed).
std::vector<int> RunTwoRanks(const std::string& endpoint, const std::string& want) {
  const std::string dir =
      (std::filesystem::temp_directory_path() /
       ("orrery-learner-comm-" + std::to_string(getpid()) + "-" +
        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count())))
          .string();
  std::vector<int> codes = RunForkedRanks(2, [&](int rank) -> int {
    const std::set<std::string> before = TcpSockets();
    LearnerCommOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.gloo_dir = dir;
    o.generation = "1";
    o.timeout_ms = 20000;
    o.endpoint = endpoint;
    o.allow_public_network = true;  // this machine's address may be a public one
    auto comm = CreateLearnerCommunicator(o);
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
      return 10;
    }
    // Gloo's sockets: pairs connected from the address to the address (the ranks' only route
    // to each other), and listeners on it where Gloo keeps them (this one closes them once the
    // mesh is up).
    std::set<std::string> now = TcpSockets();
    for (const std::string& a : before) now.erase(a);
    if (now.empty()) return 11;
    for (const std::string& socket : now) {
      if (socket != want + " -> " + want && socket != want + " -> 0.0.0.0") {
        std::fprintf(stderr, "rank %d: socket %s\n", rank, socket.c_str());
        return 12;
      }
    }
    std::vector<float> x = {static_cast<float>(rank + 1)};
    if (!(*comm)->AllReduceSum(std::span<float>(x)).ok() || x[0] != 3.0f) return 13;
    return 0;
  });
  std::filesystem::remove_all(dir);
  return codes;
}

TEST(LearnerComm, GlooRanksOfATcpFleetListenOnItsHostNotLoopback) {
  const std::string host = NonLoopbackIpv4();
  if (host.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to bind";
  // A learner's endpoint in a local tcp fleet with fleet.host = this address.
  EXPECT_EQ(RunTwoRanks("tcp://" + host + ":5609", host), (std::vector<int>{0, 0}));
}

TEST(LearnerComm, GlooRanksOfAnIpcFleetListenOnLoopback) {
  EXPECT_EQ(RunTwoRanks("ipc:///tmp/orrery-run/fleet/learner-0.sock", "127.0.0.1"),
            (std::vector<int>{0, 0}));
}

// Which addresses count as public (numeric hosts: no DNS involved).
TEST(LearnerComm, PublicAddressesAreTheGloballyRoutableOnes) {
  for (const char* local :
       {"127.0.0.1", "10.1.2.3", "172.16.0.1", "172.31.255.254", "192.168.1.1", "100.64.0.1",
        "169.254.9.9", "0.0.0.0", "192.0.2.2", "198.19.0.1", "203.0.113.5", "255.255.255.255",
        "::1", "fd00::7", "fc12::1", "fe80::1", "::ffff:10.0.0.1", "::"}) {
    EXPECT_EQ(PublicAddressOf(local), "") << local;
  }
  for (const char* routable :
       {"8.8.8.8", "172.32.0.1", "172.15.255.255", "100.128.0.1", "192.169.0.1", "198.20.0.1",
        "2001:4860:4860::8888", "::ffff:1.2.3.4"}) {
    EXPECT_NE(PublicAddressOf(routable), "") << routable;
  }
  EXPECT_EQ(PublicAddressOf("2001:4860:4860::8888"), "2001:4860:4860::8888");
  EXPECT_EQ(PublicAddressOf("no-such-host.invalid"), "") << "unresolvable: Gloo fails on its own";
  // The other question asked of the same resolution: reachable from this machine alone?
  EXPECT_TRUE(ResolvesOnlyToLoopback("127.0.1.1"));
  EXPECT_TRUE(ResolvesOnlyToLoopback("::1"));
  EXPECT_FALSE(ResolvesOnlyToLoopback("10.1.2.3"));
  EXPECT_FALSE(ResolvesOnlyToLoopback("no-such-host.invalid"));
}

// Gloo's traffic is unauthenticated: a rank whose address is public fails at once with the key
// that allows it, before it listens or waits for the other ranks.
TEST(LearnerComm, GlooRefusesToListenOnAPublicAddress) {
  LearnerCommOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.gloo_dir = (std::filesystem::temp_directory_path() /
                ("orrery-learner-public-" + std::to_string(getpid())))
                   .string();
  o.timeout_ms = 60000;
  o.endpoint = "tcp://8.8.8.8:5609";
  const auto start = std::chrono::steady_clock::now();
  auto comm = CreateLearnerCommunicator(o);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(comm.status().message().find("learner rank 1 would listen on 8.8.8.8 (8.8.8.8), a "
                                         "public address"),
            std::string::npos)
      << comm.status().message();
  EXPECT_NE(comm.status().message().find("[rl.learner] gloo_public_network = true"),
            std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(std::filesystem::exists(o.gloo_dir)) << "no rendezvous was started";
}

}  // namespace
}  // namespace orrery::rl_actors
