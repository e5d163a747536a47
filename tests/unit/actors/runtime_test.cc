// The actor runtime on real ZeroMQ sockets: inproc, ipc and tcp transports, typed handlers,
// deadlines, cancellation, malformed input, reconnection to a restarted peer, roles.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "actors/runtime/actor.h"
#include "actors/runtime/client.h"
#include "actors/runtime/echo_role.h"
#include "actors/runtime/host.h"
#include "actors/runtime/role.h"
#include "actors/schema/actor.capnp.h"
#include "core/message_limits.h"

namespace orrery {
namespace {

using std::chrono::milliseconds;
using EchoReplyT = Reply<schema::EchoReply>;

std::string TempDir() {
  std::string dir =
      std::filesystem::temp_directory_path() / ("orrery_runtime_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

// An echo actor served on its own thread.
class ServedActor {
 public:
  ServedActor(zmq::context_t& zmq, const std::string& endpoint, std::string name = "echo:0")
      : actor_(zmq, std::move(name)) {
    bind_status_ = actor_.Bind(endpoint);
    actor_.HandleWithInfo<schema::EchoRequest, schema::EchoReply>(
        kEchoMethod, [this](schema::EchoRequest::Reader req, const RequestInfo& info,
                            schema::EchoReply::Builder rep) {
          if (req.getSleepMs() > 0) info.stop->WaitFor(milliseconds(req.getSleepMs()));
          if (std::string(req.getText().cStr()) == "throw") throw std::runtime_error("boom");
          rep.setText(req.getText());
          rep.setServedBy(actor_.name());
          rep.setServed(actor_.served() + 1);
          return Status::OK();
        });
    if (bind_status_.ok()) thread_ = std::thread([this] { run_status_ = actor_.Run(stop_); });
  }
  ~ServedActor() { Stop(); }
  void Stop() {
    stop_.Cancel();
    if (thread_.joinable()) thread_.join();
  }
  const Status& bind_status() const { return bind_status_; }
  const std::string& endpoint() const { return actor_.endpoint(); }

 private:
  Actor actor_;
  Cancellation stop_;
  Status bind_status_;
  Status run_status_;
  std::thread thread_;
};

StatusOr<EchoReplyT> Echo(ActorClient& client, const std::string& text, uint32_t sleep_ms = 0,
                          CallOptions options = {}) {
  return client.Call<schema::EchoRequest, schema::EchoReply>(
      kEchoMethod,
      [&](schema::EchoRequest::Builder req) {
        req.setText(text);
        req.setSleepMs(sleep_ms);
      },
      options);
}

TEST(ActorRuntime, InprocRoundTrip) {
  zmq::context_t zmq;
  ServedActor server(zmq, "inproc://echo-roundtrip");
  ASSERT_TRUE(server.bind_status().ok()) << server.bind_status().ToString();
  ActorClient client(zmq, "test");
  ASSERT_TRUE(client.Connect("inproc://echo-roundtrip").ok());
  for (int i = 1; i <= 3; ++i) {
    auto reply = Echo(client, "hello " + std::to_string(i));
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(std::string(reply->get().getText().cStr()), "hello " + std::to_string(i));
    EXPECT_EQ(std::string(reply->get().getServedBy().cStr()), "echo:0");
    EXPECT_EQ(reply->get().getServed(), static_cast<uint64_t>(i));
  }
}

TEST(ActorRuntime, IpcAndTcpTransports) {
  zmq::context_t zmq;
  const std::string ipc = "ipc://" + TempDir() + "/echo.sock";
  ServedActor over_ipc(zmq, ipc);
  ASSERT_TRUE(over_ipc.bind_status().ok()) << over_ipc.bind_status().ToString();
  ServedActor over_tcp(zmq, "tcp://127.0.0.1:*");
  ASSERT_TRUE(over_tcp.bind_status().ok()) << over_tcp.bind_status().ToString();
  EXPECT_NE(over_tcp.endpoint().find("tcp://127.0.0.1:"), std::string::npos);
  EXPECT_EQ(over_tcp.endpoint().find('*'), std::string::npos);
  for (const std::string& endpoint : {ipc, over_tcp.endpoint()}) {
    ActorClient client(zmq, "test");
    ASSERT_TRUE(client.Connect(endpoint).ok());
    auto reply = Echo(client, "via " + endpoint);
    ASSERT_TRUE(reply.ok()) << endpoint << ": " << reply.status().ToString();
    EXPECT_EQ(std::string(reply->get().getText().cStr()), "via " + endpoint);
  }
}

TEST(ActorRuntime, BindingATakenAddressFailsWithTheEndpoint) {
  zmq::context_t zmq;
  ServedActor first(zmq, "inproc://taken");
  ASSERT_TRUE(first.bind_status().ok());
  Actor second(zmq, "second");
  Status s = second.Bind("inproc://taken");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("inproc://taken"), std::string::npos) << s.message();
  Actor unbound(zmq, "unbound");
  Cancellation stop;
  EXPECT_EQ(unbound.Run(stop).code(), StatusCode::kFailedPrecondition);
}

TEST(ActorRuntime, UnknownMethodAndHandlerExceptionsBecomeErrors) {
  zmq::context_t zmq;
  ServedActor server(zmq, "inproc://echo-errors");
  ActorClient client(zmq, "test");
  ASSERT_TRUE(client.Connect("inproc://echo-errors").ok());
  auto unknown = client.Call<schema::EchoRequest, schema::EchoReply>(
      "echo.Nope", [](schema::EchoRequest::Builder) {});
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnimplemented);
  auto thrown = Echo(client, "throw");
  EXPECT_EQ(thrown.status().code(), StatusCode::kInternal);
  EXPECT_NE(thrown.status().message().find("boom"), std::string::npos);
  // The loop survived both.
  EXPECT_TRUE(Echo(client, "still here").ok());
}

TEST(ActorRuntime, MalformedMessagesDoNotStopTheLoop) {
  zmq::context_t zmq;
  ServedActor server(zmq, "inproc://echo-malformed");
  zmq::socket_t raw(zmq, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect("inproc://echo-malformed");
  raw.send(zmq::str_buffer("one frame only"), zmq::send_flags::none);
  raw.send(zmq::str_buffer("1234567"), zmq::send_flags::sndmore);  // not a word multiple
  raw.send(zmq::str_buffer("body"), zmq::send_flags::none);
  const char bad_segments[16] = {0x7f, 0x7f, 0x7f, 0x7f, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  raw.send(zmq::buffer(bad_segments, 16), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(bad_segments, 16), zmq::send_flags::none);
  ActorClient client(zmq, "test");
  ASSERT_TRUE(client.Connect("inproc://echo-malformed").ok());
  auto reply = Echo(client, "after garbage");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->get().getServed(), 1u);
}

// ZMQ_MAXMSGSIZE (core/message_limits.h): a message over the limit never reaches a handler (ZeroMQ
// drops the connection while decoding it; inproc has no decoder, so ipc is used), and the
// client's next call, on a new connection, is served.
TEST(ActorRuntime, AMessageOverTheLimitNeverReachesTheHandler) {
  SetMaxMessageBytes(1 << 20);
  {
    zmq::context_t zmq;
    ServedActor server(zmq, "ipc://" + TempDir() + "/maxmsg.sock");
    ASSERT_TRUE(server.bind_status().ok()) << server.bind_status().ToString();
    ActorClient client(zmq, "test");
    ASSERT_TRUE(client.Connect(server.endpoint()).ok());
    auto big = Echo(client, std::string(2 << 20, 'x'), 0, CallOptions{milliseconds(500), nullptr});
    EXPECT_FALSE(big.ok()) << "a 2 MiB message was served with a 1 MiB limit";
    auto small = Echo(client, "small", 0, CallOptions{milliseconds(5000), nullptr});
    ASSERT_TRUE(small.ok()) << small.status().ToString();
    EXPECT_EQ(small->get().getServed(), 1u);
  }
  SetMaxMessageBytes(kDefaultMaxMessageBytes);
}

TEST(ActorRuntime, DeadlinePassesWhileServerIsBusy) {
  zmq::context_t zmq;
  ServedActor server(zmq, "inproc://echo-deadline");
  ActorClient client(zmq, "test");
  ASSERT_TRUE(client.Connect("inproc://echo-deadline").ok());
  const auto start = std::chrono::steady_clock::now();
  auto slow = Echo(client, "slow", /*sleep_ms=*/400, CallOptions{milliseconds(100), nullptr});
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(slow.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(waited, milliseconds(350));
  // Queued behind the slow one with a deadline that passes before the server gets to it: the
  // server must skip it, and its late reply must not be taken for the next call's.
  auto skipped = Echo(client, "skipped", 0, CallOptions{milliseconds(50), nullptr});
  EXPECT_EQ(skipped.status().code(), StatusCode::kDeadlineExceeded);
  auto next = Echo(client, "next", 0, CallOptions{milliseconds(2000), nullptr});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(std::string(next->get().getText().cStr()), "next");
  // The slow request ran (served 1), the expired one did not: "next" is the second served.
  EXPECT_EQ(next->get().getServed(), 2u);
}

TEST(ActorRuntime, CancellationEndsAWaitAtOnce) {
  zmq::context_t zmq;
  ActorClient client(zmq, "test");
  // Nobody listens here: without cancellation the call would wait for the full 10 s.
  ASSERT_TRUE(client.Connect("inproc://nobody").ok());
  Cancellation cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(50));
    cancel.Cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  auto reply = Echo(client, "x", 0, CallOptions{milliseconds(10000), &cancel});
  canceller.join();
  EXPECT_EQ(reply.status().code(), StatusCode::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  EXPECT_TRUE(cancel.WaitFor(milliseconds(0)));
}

TEST(ActorRuntime, ClientReachesARestartedPeerAtTheSameEndpoint) {
  zmq::context_t zmq;
  const std::string ipc = "ipc://" + TempDir() + "/restart.sock";
  ActorClient client(zmq, "test");
  ASSERT_TRUE(client.Connect(ipc).ok());
  {
    ServedActor first(zmq, ipc, "echo:first");
    auto reply = Echo(client, "a");
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(std::string(reply->get().getServedBy().cStr()), "echo:first");
  }
  ServedActor second(zmq, ipc, "echo:second");
  ASSERT_TRUE(second.bind_status().ok()) << second.bind_status().ToString();
  StatusOr<EchoReplyT> reply = DeadlineExceededError("not tried");
  for (int attempt = 0; attempt < 20 && !reply.ok(); ++attempt) {
    reply = Echo(client, "b", 0, CallOptions{milliseconds(250), nullptr});
  }
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(std::string(reply->get().getServedBy().cStr()), "echo:second");
}

TEST(ActorRoles, RegistryRejectsBadNamesAndDuplicates) {
  RegisterEchoRole();
  RegisterEchoRole();  // idempotent
  ASSERT_NE(FindActorRole("echo"), nullptr);
  RegisterActorRole({"echo", "a second echo", [](ActorContext&) { return Status::OK(); }});
  EXPECT_EQ(FindActorRole("echo")->help, "answers echo.Echo; for smoke tests of a fleet");
  RegisterActorRole({"Bad-Name", "", [](ActorContext&) { return Status::OK(); }});
  EXPECT_EQ(FindActorRole("Bad-Name"), nullptr);
  EXPECT_EQ(FindActorRole("nope"), nullptr);
  const auto names = ActorRoleNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "echo"), names.end());
}

TEST(ActorRoles, EchoRoleRunsStandaloneOnAThread) {
  RegisterEchoRole();
  zmq::context_t zmq;
  ActorHostOptions options;
  options.role = "echo";
  options.index = 2;
  options.endpoint = "inproc://echo-role";
  options.run_dir = TempDir();
  auto thread = ActorThread::Start(zmq, options);
  ActorClient client(zmq, "test");
  ASSERT_TRUE(client.Connect(options.endpoint).ok());
  StatusOr<EchoReplyT> reply = DeadlineExceededError("not tried");
  for (int attempt = 0; attempt < 20 && !reply.ok(); ++attempt) {
    reply = Echo(client, "role", 0, CallOptions{milliseconds(200), nullptr});
  }
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(std::string(reply->get().getServedBy().cStr()), "echo:2");
  EXPECT_TRUE(std::filesystem::is_directory(options.run_dir + "/actors/echo-2"));
  EXPECT_TRUE(thread->Stop().ok());
  EXPECT_TRUE(thread->finished());
}

TEST(ActorRoles, UnknownRoleIsAnError) {
  zmq::context_t zmq;
  ActorHostOptions options;
  options.role = "no_such_role";
  options.endpoint = "inproc://x";
  Cancellation stop;
  Status s = RunActor(zmq, options, stop);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown actor role 'no_such_role'"), std::string::npos);
}

}  // namespace
}  // namespace orrery
