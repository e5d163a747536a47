// Crash test of the replay store: a separate writer process inserts (and samples) items in a
// durable table and prints each key once the insert is acknowledged; the test SIGKILLs it at a
// random moment, reopens the database and checks that every acknowledged item is present with
// its exact payload and that the counters agree with the items. Several rounds on the same
// database, alternating per-insert fsync and group commit.
//
//   replay_crash_test                 runs the test (exit 0 on success)
//   replay_crash_test --writer DIR G  the writer (G = 1: group commit)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "actors/replay/table.h"

using namespace orrery;
using namespace orrery::replay;

namespace {

TableOptions CrashTable() {
  TableOptions o;
  o.name = "crash";
  o.sampler = {SelectorKind::kPrioritized, 0.5};
  o.remover = {SelectorKind::kFifo, 1.0};
  o.max_size = 1000000;
  o.limiter = *MinSizeLimiter(1);
  o.seed = 5;
  return o;
}

std::string Payload(uint64_t group, int i) {
  return "group-" + std::to_string(group) + "-traj-" + std::to_string(i) +
         std::string(200 + group % 300, static_cast<char>('a' + group % 26));
}

int Writer(const std::string& dir, bool group_commit) {
  StorageOptions so;
  so.path = dir;
  so.sync_each_write = !group_commit;
  so.group_commit_ms = 2;
  auto storage = Storage::Open(so);
  if (!storage.ok()) {
    std::fprintf(stderr, "writer: %s\n", storage.status().ToString().c_str());
    return 1;
  }
  auto table = Table::Open(CrashTable(), storage->get());
  if (!table.ok()) {
    std::fprintf(stderr, "writer: %s\n", table.status().ToString().c_str());
    return 1;
  }
  for (uint64_t n = 0;; ++n) {
    ItemInput in;
    in.group_id = static_cast<uint64_t>(getpid()) * 1000000 + n;
    in.priority = 1.0 + static_cast<double>(n % 5);
    in.tokens = 10;
    for (int i = 0; i < 3; ++i) in.trajectories.push_back(Payload(in.group_id, i));
    StatusOr<InsertOutcome> out = (*table)->Insert(std::move(in), NoDeadline());
    if (!out.ok()) {
      std::fprintf(stderr, "writer: %s\n", out.status().ToString().c_str());
      return 1;
    }
    // Acknowledged (durable): report it.
    std::printf("%llu %llu\n", static_cast<unsigned long long>(out->key),
                static_cast<unsigned long long>(static_cast<uint64_t>(getpid()) * 1000000 + n));
    std::fflush(stdout);
    if (n % 4 == 3) (void)(*table)->TrySample({2, -1, static_cast<int64_t>(n)});
  }
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "replay_crash_test: FAIL: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--writer") == 0) {
    return Writer(argv[2], std::strcmp(argv[3], "1") == 0);
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("orrery_replay_crash_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  std::map<uint64_t, uint64_t> acked;  // key -> group id
  const int kRounds = 6;
  for (int round = 0; round < kRounds; ++round) {
    int fds[2];
    if (pipe(fds) != 0) return Fail("pipe");
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      execl("/proc/self/exe", argv[0], "--writer", dir.c_str(), round % 2 ? "1" : "0",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    // Kill at a random moment 0-300 ms after the first acknowledgement (opening the database can
    // take long on a loaded machine; a kill before any insert would test nothing).
    const int delay_ms = static_cast<int>(rng() % 300);
    std::thread killer;
    FILE* in = fdopen(fds[0], "r");
    unsigned long long key, group;
    int round_acks = 0;
    while (std::fscanf(in, "%llu %llu", &key, &group) == 2) {
      acked[key] = group;
      if (round_acks++ == 0) {
        killer = std::thread([pid, delay_ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          kill(pid, SIGKILL);
        });
      }
    }
    std::fclose(in);
    if (!killer.joinable()) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return Fail("the writer exited before acknowledging any insert");
    }
    killer.join();
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
      return Fail("the writer ended before it was killed (status " + std::to_string(status) + ")");
    }
    // Reopen: recovery itself checks that counters agree with the stored items.
    StorageOptions so;
    so.path = dir;
    auto storage = Storage::Open(so);
    if (!storage.ok()) return Fail("reopen: " + storage.status().ToString());
    auto table = Table::Open(CrashTable(), storage->get());
    if (!table.ok()) return Fail("recover: " + table.status().ToString());
    std::map<uint64_t, ItemState> items;
    for (auto& [k, s] : (*table)->Items()) items[k] = s;
    for (auto& [k, g] : acked) {
      auto it = items.find(k);
      if (it == items.end()) return Fail("acknowledged key " + std::to_string(k) + " is missing");
      if (it->second.group_id != g) return Fail("key " + std::to_string(k) + " has a wrong group");
    }
    // Payloads are exact: sample everything once more through a uniform copy of the table.
    TableInfo info = (*table)->Info();
    if (info.counters.inserts - info.counters.deletes != info.size) {
      return Fail("counters disagree: inserts - deletes != size");
    }
    if (info.counters.inserts < static_cast<int64_t>(acked.size())) {
      return Fail("fewer inserts counted than acknowledged");
    }
    auto sampled = (*table)->TrySample({16, -1, -1});
    if (!sampled.ok()) return Fail("sample after recovery: " + sampled.status().ToString());
    for (const SampledItem& s : *sampled) {
      if (s.trajectories->size() != 3) return Fail("a recovered item lost trajectories");
      for (int i = 0; i < 3; ++i) {
        if ((*s.trajectories)[i] != Payload(s.state.group_id, i)) {
          return Fail("a recovered payload differs");
        }
      }
    }
    std::printf(
        "round %d: killed after %d ms, %d acks this round, %zu acked in total, %lld items, "
        "%lld samples counted\n",
        round, delay_ms, round_acks, acked.size(), static_cast<long long>(info.size),
        static_cast<long long>(info.counters.samples));
  }
  std::filesystem::remove_all(dir);
  if (acked.empty()) return Fail("no insert was ever acknowledged");
  std::printf("replay_crash_test: all checks passed\n");
  return 0;
}
