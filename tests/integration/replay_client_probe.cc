// Drives a running replay store (see replay_server_test.sh): inserts and samples through the
// client, a parked sample answered at its deadline, a blocked sample woken by an insert from
// another client, then garbage (random bytes, a truncated request, an empty frame, an unknown
// table, an oversized item), after each of which the store must answer with an error and keep
// serving. Exit 0 when every check passes.
#include <capnp/message.h>

#include <cstdio>
#include <random>
#include <thread>

#include "actors/replay/capnp_io.h"
#include "actors/replay/client.h"
#include "actors/replay/wire.h"
#include "actors/schema/replay.capnp.h"

using namespace orrery;
using namespace orrery::replay;

#define CHECK(cond, what)                                            \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::fprintf(stderr, "replay_client_probe: FAIL: %s\n", what); \
      return 1;                                                      \
    }                                                                \
  } while (0)

namespace {

bool IsErrorReply(const StatusOr<std::string>& reply) {
  if (!reply.ok()) return false;
  bool error = false;
  Status s = ReadCapnpMessage<schema::ReplayReply>(*reply, "reply", [&](auto r) {
    error = r.isError();
    return Status::OK();
  });
  return s.ok() && error;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string endpoint = argv[1];
  zmq::context_t ctx(1);
  auto client = ReplayClient::Connect(endpoint, &ctx);
  CHECK(client.ok(), "connect");
  ReplayClient& c = **client;

  // An empty table: a sample with a 100 ms deadline is parked and answered DeadlineExceeded.
  auto early = c.Sample("t", {1, -1, -1}, 100);
  CHECK(!early.ok() && early.status().code() == StatusCode::kDeadlineExceeded,
        "sample of an empty table should hit its deadline");

  // A blocked sample is woken by another client's insert.
  std::thread waiter_thread;
  StatusOr<std::vector<SampledItem>> woken = std::vector<SampledItem>{};
  waiter_thread = std::thread([&] {
    auto other = ReplayClient::Connect(endpoint, &ctx);
    if (other.ok()) woken = (*other)->Sample("t", {1, -1, 7}, 5000);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ItemInput item;
  item.group_id = 42;
  item.priority = 2.0;
  item.tokens = 5;
  item.trajectories = {"first", std::string(1000, 'x')};
  auto ins = c.Insert("t", item, 1000);
  CHECK(ins.ok() && ins->key > 0, "insert");
  waiter_thread.join();
  CHECK(woken.ok() && woken->size() == 1, "the parked sample was not woken by the insert");
  CHECK((*woken)[0].state.group_id == 42 && (*woken)[0].trajectories->size() == 2 &&
            (*(*woken)[0].trajectories)[1] == std::string(1000, 'x'),
        "sampled group differs from the inserted one");

  // Garbage.
  std::mt19937 rng(1);
  for (int i = 0; i < 20; ++i) {
    std::string junk(8 * (1 + rng() % 64), '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    auto reply = c.CallRaw(junk, 2000);
    CHECK(reply.ok(), "no reply to random bytes");
  }
  CHECK(IsErrorReply(c.CallRaw("", 2000)), "empty frame");
  CHECK(IsErrorReply(c.CallRaw("abc", 2000)), "3 bytes");
  {
    capnp::MallocMessageBuilder b;
    auto req = b.initRoot<schema::ReplayRequest>();
    req.setId(9);
    auto in = req.initInsert();
    in.setTable("t");
    in.initTrajectories(1).set(
        0, kj::ArrayPtr<const kj::byte>(reinterpret_cast<const kj::byte*>("abcdefgh"), 8));
    std::string bytes = CapnpToBytes(b);
    CHECK(IsErrorReply(c.CallRaw(bytes.substr(0, bytes.size() - 16), 2000)), "truncated request");
  }
  auto unknown = c.Insert("nope", item, 0);
  CHECK(!unknown.ok() && unknown.status().code() == StatusCode::kNotFound, "unknown table");
  ItemInput big = item;
  big.trajectories = {std::string(2000000, 'y')};
  auto oversized = c.Insert("t", big, 0);
  CHECK(!oversized.ok() && oversized.status().code() == StatusCode::kResourceExhausted,
        "oversized item");
  auto bad_update = c.UpdatePriorities("t", {{ins->key, -1.0}});
  CHECK(!bad_update.ok(), "negative priority accepted");

  // Still serving, with the state intact.
  auto info = c.Info();
  CHECK(info.ok() && info->size() == 1, "info after garbage");
  CHECK((*info)[0].size == 1 && (*info)[0].counters.inserts == 1, "counters after garbage");
  auto again = c.Sample("t", {4, -1, -1}, 1000);
  CHECK(again.ok() && again->size() == 4, "sampling after garbage");
  std::printf("replay_client_probe: all checks passed\n");
  return 0;
}
