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

}  // namespace
}  // namespace orrery::rl_actors
