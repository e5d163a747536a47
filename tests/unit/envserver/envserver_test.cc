// The environment server through real ZeroMQ sockets (inproc and tcp loopback) with the calc
// environment: remote episodes equal local ones, bad input gets error replies while the server
// keeps serving, unknown env / episode errors, concurrent episodes, busy episodes, idle expiry,
// and the "episode lost" answer after a restart at the same endpoint.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <zmq.hpp>

#include "actors/envserver/client.h"
#include "actors/envserver/codec.h"
#include "actors/envserver/server.h"
#include "actors/runtime/client.h"
#include "actors/runtime/wire.h"
#include "actors/schema/actor.capnp.h"
#include "actors/schema/env.capnp.h"
#include "env/calc/calc_env.h"
#include "env/calc/task.h"

namespace orrery::envserver {
namespace {

using std::chrono::milliseconds;

calc::CalcEnvOptions CalcOptions() {
  calc::CalcEnvOptions o;
  o.seed = 11;
  o.difficulty = 2;
  return o;
}

// A server on its own thread, stopped and joined by the destructor.
class RunningServer {
 public:
  RunningServer(zmq::context_t& zmq, const std::string& endpoint, EnvServerOptions options = {},
                std::unique_ptr<env::Env> extra = nullptr) {
    std::vector<std::unique_ptr<env::Env>> envs;
    envs.push_back(calc::MakeCalcEnv(CalcOptions()));
    if (extra) envs.push_back(std::move(extra));
    server_ = std::make_unique<EnvServer>(zmq, "env:test", std::move(envs), options);
    bound_ = server_->Bind(endpoint);
    if (bound_.ok()) thread_ = std::thread([this] { run_ = server_->Run(stop_); });
  }
  ~RunningServer() { Stop(); }
  void Stop() {
    stop_.Cancel();
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  const Status& bound() const { return bound_; }
  EnvServer& server() { return *server_; }

 private:
  std::unique_ptr<EnvServer> server_;
  Cancellation stop_;
  Status bound_;
  Status run_;
  std::thread thread_;
};

std::string Json(const std::vector<ChatMessage>& m) { return ChatMessagesToJson(m); }

ToolCall Calculate(const std::string& expression) {
  return ToolCall{"call_0", "calculate", "{\"expression\": \"" + expression + "\"}"};
}

TEST(EnvServerTest, RemoteEpisodeEqualsLocalEpisode) {
  zmq::context_t zmq;
  RunningServer running(zmq, "inproc://envserver-equal");
  ASSERT_TRUE(running.bound().ok()) << running.bound().ToString();
  EnvClient client(zmq, "test", {milliseconds(5000)});
  ASSERT_TRUE(client.Connect("inproc://envserver-equal").ok());

  std::unique_ptr<env::Env> local_env = calc::MakeCalcEnv(CalcOptions());
  for (uint64_t index : {0, 5, 17}) {
    StatusOr<env::TaskRef> task = local_env->Task(env::Split::kTrain, index);
    ASSERT_TRUE(task.ok());
    auto local = local_env->Reset(*task, env::DeadlineIn(5));
    ASSERT_TRUE(local.ok());
    StatusOr<RemoteEpisode> remote = client.Reset("calc", env::Split::kTrain, index);
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    EXPECT_EQ(remote->task.id, task->id);
    EXPECT_EQ(remote->task.seed, task->seed);
    EXPECT_EQ(Json(remote->messages), Json((*local)->initial_messages()));
    EXPECT_EQ(env::ToolSpecsToJson(remote->tools), env::ToolSpecsToJson((*local)->tools()));

    StatusOr<calc::CalcTask> calc_task =
        calc::MakeCalcTask(CalcOptions().seed, env::Split::kTrain, index, 2);
    ASSERT_TRUE(calc_task.ok());
    // A good call, a malformed one and an unknown tool: each result equal, error flag included.
    const std::vector<ToolCall> calls = {Calculate(calc_task->expression),
                                         ToolCall{"call_1", "calculate", "{not json"},
                                         ToolCall{"call_2", "rm", "{}"}, Calculate("1/0")};
    std::vector<ChatMessage> trajectory = (*local)->initial_messages();
    for (const ToolCall& call : calls) {
      auto l = (*local)->Step(call, env::DeadlineIn(5));
      auto r = client.Step(remote->id, call);
      ASSERT_TRUE(l.ok());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->content, l->content);
      EXPECT_EQ(r->is_error, l->is_error);
      ChatMessage asked{ChatRole::kAssistant, "", {call}, "", ""};
      trajectory.push_back(asked);
      trajectory.push_back(ChatMessage{ChatRole::kTool, r->content, {}, call.id, call.name});
    }
    EXPECT_EQ(trajectory[trajectory.size() - 7].content, calc_task->answer_text);
    for (const std::string& answer : {calc_task->answer_text, std::string("-123456")}) {
      std::vector<ChatMessage> t = trajectory;
      t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + answer, {}, "", ""});
      auto l = (*local)->Score(t, env::DeadlineIn(5));
      auto r = client.Score(remote->id, t);
      ASSERT_TRUE(l.ok());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->reward, l->reward);
      EXPECT_EQ(r->components, l->components);
    }
    StatusOr<bool> closed = client.Close(remote->id);
    ASSERT_TRUE(closed.ok());
    EXPECT_TRUE(*closed);
    closed = client.Close(remote->id);  // idempotent
    ASSERT_TRUE(closed.ok());
    EXPECT_FALSE(*closed);
  }
}

TEST(EnvServerTest, RewardOneForTheRightAnswerOverTcp) {
  zmq::context_t zmq;
  RunningServer running(zmq, "tcp://127.0.0.1:*");
  ASSERT_TRUE(running.bound().ok());
  EnvClient client(zmq, "test", {milliseconds(5000)});
  ASSERT_TRUE(client.Connect(running.server().endpoint()).ok());
  auto ep = client.Reset("calc", env::Split::kTest, 2);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto task = calc::MakeCalcTask(CalcOptions().seed, env::Split::kTest, 2, 2);
  ASSERT_TRUE(task.ok());
  std::vector<ChatMessage> t = ep->messages;
  t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + task->answer_text, {}, "", ""});
  auto score = client.Score(ep->id, t);
  ASSERT_TRUE(score.ok());
  EXPECT_EQ(score->reward, 1.0);
  auto info = client.Describe();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->incarnation, running.server().incarnation());
  EXPECT_EQ(info->envs, std::vector<std::string>{"calc"});
  EXPECT_EQ(info->open_episodes, 1u);
}

TEST(EnvServerTest, UnknownEnvEpisodeSplitAndMethod) {
  zmq::context_t zmq;
  RunningServer running(zmq, "inproc://envserver-unknown");
  EnvClient client(zmq, "test", {milliseconds(3000)});
  ASSERT_TRUE(client.Connect("inproc://envserver-unknown").ok());
  auto r = client.Reset("chess", env::Split::kTrain, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("unknown env 'chess' (served here: calc)"), std::string::npos)
      << r.status().message();
  auto s = client.Step("0000000000000000-1", Calculate("1+1"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(IsEpisodeLost(s.status()));  // incarnation 0 is nobody's
  auto own = running.server().incarnation();
  char id[40];
  std::snprintf(id, sizeof(id), "%016llx-999", static_cast<unsigned long long>(own));
  s = client.Step(id, Calculate("1+1"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("unknown episode"), std::string::npos);
  std::snprintf(id, sizeof(id), "%016llx-0", static_cast<unsigned long long>(own ^ 1));
  s = client.Step(id, Calculate("1+1"));
  EXPECT_TRUE(IsEpisodeLost(s.status())) << s.status().ToString();

  // A bad split name, sent raw.
  ActorClient raw(zmq, "raw");
  ASSERT_TRUE(raw.Connect("inproc://envserver-unknown").ok());
  auto bad_split = raw.Call<schema::ResetRequest, schema::ResetReply>(
      "env.Reset", [](schema::ResetRequest::Builder b) {
        b.setEnv("calc");
        b.setSplit("validation");
      });
  ASSERT_FALSE(bad_split.ok());
  EXPECT_EQ(bad_split.status().code(), StatusCode::kInvalidArgument);
  auto no_method = raw.Call<schema::DescribeRequest, schema::DescribeReply>(
      "env.Explode", [](schema::DescribeRequest::Builder) {});
  ASSERT_FALSE(no_method.ok());
  EXPECT_EQ(no_method.status().code(), StatusCode::kUnimplemented);
}

// Sends raw frames on a DEALER and returns the reply's envelope.
StatusOr<Envelope> SendRaw(zmq::socket_t& dealer, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    (void)dealer.send(zmq::buffer(frames[i]),
                      i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, milliseconds(3000));
  if (!(item.revents & ZMQ_POLLIN)) return DeadlineExceededError("no reply");
  ORRERY_ASSIGN_OR_RETURN(WireMessage m, ReceiveWireMessage(dealer, /*with_identity=*/false));
  return m.envelope;
}

std::string Words(capnp::MessageBuilder& message) {
  auto words = MessageWords(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

std::string EnvelopeBytes(const std::string& method, uint64_t request_id) {
  capnp::MallocMessageBuilder b;
  auto e = b.initRoot<schema::Envelope>();
  e.setMethod(method);
  e.setRequestId(request_id);
  e.setSender("raw");
  return Words(b);
}

TEST(EnvServerTest, GarbageAndTruncatedMessagesGetErrorRepliesAndServingGoesOn) {
  zmq::context_t zmq;
  RunningServer running(zmq, "inproc://envserver-garbage");
  zmq::socket_t dealer(zmq, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect("inproc://envserver-garbage");

  // Not Cap'n Proto at all.
  auto r = SendRaw(dealer, {"hello", "world"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status.code(), StatusCode::kInvalidArgument);
  // One frame only.
  r = SendRaw(dealer, {EnvelopeBytes("env.Describe", 1)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status.code(), StatusCode::kInvalidArgument);
  // A good envelope and a truncated body: the reply carries the request id.
  capnp::MallocMessageBuilder step;
  auto s = step.initRoot<schema::StepRequest>();
  s.setEpisodeId(std::string(200, 'x'));
  s.initCall().setArgumentsJson(std::string(300, 'y'));
  std::string body = Words(step);
  r = SendRaw(dealer, {EnvelopeBytes("env.Step", 7), body.substr(0, body.size() / 2 / 8 * 8)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->request_id, 7u);
  EXPECT_NE(r->status.code(), StatusCode::kOk);
  // A body that is not a whole number of words.
  r = SendRaw(dealer, {EnvelopeBytes("env.Reset", 8), body.substr(0, 13)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->request_id, 8u);
  EXPECT_EQ(r->status.code(), StatusCode::kInvalidArgument);
  // Valid words of the wrong struct where a list of messages is expected.
  capnp::MallocMessageBuilder wrong;
  wrong.initRoot<schema::DescribeReply>().setServedBy("zzz");
  r = SendRaw(dealer, {EnvelopeBytes("env.Score", 9), Words(wrong)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->request_id, 9u);
  EXPECT_NE(r->status.code(), StatusCode::kOk);

  // Still serving.
  EnvClient client(zmq, "test", {milliseconds(3000)});
  ASSERT_TRUE(client.Connect("inproc://envserver-garbage").ok());
  auto ep = client.Reset("calc", env::Split::kTrain, 1);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto step_result = client.Step(ep->id, Calculate("6*7"));
  ASSERT_TRUE(step_result.ok());
  EXPECT_EQ(step_result->content, "42");
}

TEST(EnvServerTest, ConcurrentEpisodesFromSeveralClients) {
  zmq::context_t zmq;
  RunningServer running(zmq, "tcp://127.0.0.1:*");
  const std::string endpoint = running.server().endpoint();
  constexpr int kClients = 6, kEpisodes = 8;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      EnvClient client(zmq, "client" + std::to_string(c), {milliseconds(10000)});
      if (!client.Connect(endpoint).ok()) return;
      // Open all episodes first, then interleave their steps.
      std::vector<RemoteEpisode> eps;
      for (int e = 0; e < kEpisodes; ++e) {
        auto ep = client.Reset("calc", env::Split::kTrain, static_cast<uint64_t>(c * 100 + e));
        if (!ep.ok()) return;
        eps.push_back(std::move(ep).value());
      }
      for (int e = 0; e < kEpisodes; ++e) {
        const uint64_t index = static_cast<uint64_t>(c * 100 + e);
        auto task = calc::MakeCalcTask(CalcOptions().seed, env::Split::kTrain, index, 2);
        auto step = client.Step(eps[e].id, Calculate(task->expression));
        if (!step.ok() || step->content != task->answer_text) return;
        std::vector<ChatMessage> t = eps[e].messages;
        t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + step->content, {}, "", ""});
        auto score = client.Score(eps[e].id, t);
        if (!score.ok() || score->reward != 1.0) return;
        if (!client.Close(eps[e].id).ok()) return;
        ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients * kEpisodes);
}

// An environment whose steps sleep: a slow episode must not hold up the others.
class SlowEnv : public env::Env {
 public:
  std::string name() const override { return "slow"; }
  StatusOr<env::TaskRef> Task(env::Split split, uint64_t index) const override {
    return env::TaskRef{"slow/" + std::to_string(index), split, 0, index};
  }
  StatusOr<std::unique_ptr<env::Episode>> Reset(const env::TaskRef&, env::Deadline) override {
    return std::unique_ptr<env::Episode>(new Episode());
  }

 private:
  class Episode : public env::Episode {
   public:
    const std::vector<ChatMessage>& initial_messages() const override { return messages_; }
    const std::vector<env::ToolSpec>& tools() const override { return tools_; }
    StatusOr<env::ToolResult> Step(const ToolCall& call, env::Deadline deadline) override {
      const auto sleep = milliseconds(std::stoi(call.arguments_json));
      if (env::Clock::now() + sleep > deadline) {
        std::this_thread::sleep_until(deadline);
        return DeadlineExceededError("slow step");
      }
      std::this_thread::sleep_for(sleep);
      return env::ToolResult{"slept", false, 0};
    }
    StatusOr<env::EpisodeScore> Score(const std::vector<ChatMessage>&, env::Deadline) override {
      return env::EpisodeScore{};
    }

   private:
    std::vector<ChatMessage> messages_;
    std::vector<env::ToolSpec> tools_;
  };
};

TEST(EnvServerTest, SlowStepDoesNotBlockOtherEpisodesAndBusyEpisodeRefusesASecondCall) {
  zmq::context_t zmq;
  EnvServerOptions options;
  options.workers = 4;
  RunningServer running(zmq, "inproc://envserver-slow", options, std::make_unique<SlowEnv>());
  EnvClient slow_client(zmq, "slow", {milliseconds(5000)});
  EnvClient fast_client(zmq, "fast", {milliseconds(5000)});
  ASSERT_TRUE(slow_client.Connect("inproc://envserver-slow").ok());
  ASSERT_TRUE(fast_client.Connect("inproc://envserver-slow").ok());
  auto slow_ep = slow_client.Reset("slow", env::Split::kTrain, 0);
  ASSERT_TRUE(slow_ep.ok()) << slow_ep.status().ToString();
  std::atomic<bool> slow_done{false};
  std::thread slow([&] {
    auto r = slow_client.Step(slow_ep->id, ToolCall{"c", "sleep", "1500"});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    slow_done = true;
  });
  std::this_thread::sleep_for(milliseconds(100));
  // The same episode while it is busy: refused at once.
  auto busy = fast_client.Step(slow_ep->id, ToolCall{"c", "sleep", "1"});
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kFailedPrecondition);
  // Other episodes go on while the slow step sleeps.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    auto ep = fast_client.Reset("calc", env::Split::kTrain, static_cast<uint64_t>(i));
    ASSERT_TRUE(ep.ok());
    auto step = fast_client.Step(ep->id, Calculate("2+2"));
    ASSERT_TRUE(step.ok());
    EXPECT_EQ(step->content, "4");
  }
  EXPECT_FALSE(slow_done.load()) << "the fast episodes waited for the slow step";
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1200));
  slow.join();
  EXPECT_TRUE(slow_done.load());
}

TEST(EnvServerTest, CallerDeadlineBoundsAStepAndTheEpisodeSurvives) {
  zmq::context_t zmq;
  RunningServer running(zmq, "inproc://envserver-deadline", {}, std::make_unique<SlowEnv>());
  EnvClient client(zmq, "c", {milliseconds(300), milliseconds(1000)});
  ASSERT_TRUE(client.Connect("inproc://envserver-deadline").ok());
  auto ep = client.Reset("slow", env::Split::kTrain, 0);
  ASSERT_TRUE(ep.ok());
  const auto start = std::chrono::steady_clock::now();
  auto r = client.Step(ep->id, ToolCall{"c", "sleep", "5000"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2500));
  // The server ran the step under the caller's deadline, so the episode is free again soon.
  std::this_thread::sleep_for(milliseconds(300));
  auto again = client.Step(ep->id, ToolCall{"c", "sleep", "1"});
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST(EnvServerTest, IdleEpisodesAreClosedAndCapacityIsEnforced) {
  zmq::context_t zmq;
  EnvServerOptions options;
  options.idle_timeout_s = 0.3;
  options.max_episodes = 2;
  RunningServer running(zmq, "inproc://envserver-idle", options);
  EnvClient client(zmq, "c", {milliseconds(3000)});
  ASSERT_TRUE(client.Connect("inproc://envserver-idle").ok());
  auto a = client.Reset("calc", env::Split::kTrain, 0);
  auto b = client.Reset("calc", env::Split::kTrain, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = client.Reset("calc", env::Split::kTrain, 2);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  std::this_thread::sleep_for(milliseconds(900));
  auto step = client.Step(a->id, Calculate("1+1"));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kNotFound);
  auto info = client.Describe();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->open_episodes, 0u);
  EXPECT_TRUE(client.Reset("calc", env::Split::kTrain, 2).ok());
}

TEST(EnvServerTest, RestartAtTheSameEndpointReportsEpisodeLost) {
  zmq::context_t zmq;
  auto first = std::make_unique<RunningServer>(zmq, "tcp://127.0.0.1:*");
  const std::string endpoint = first->server().endpoint();
  EnvClient client(zmq, "c", {milliseconds(700), milliseconds(700)});
  ASSERT_TRUE(client.Connect(endpoint).ok());
  auto ep = client.Reset("calc", env::Split::kTrain, 0);
  ASSERT_TRUE(ep.ok());
  first->Stop();
  // Down: a call fails (no new incarnation to compare with yet).
  auto down = client.Step(ep->id, Calculate("1+1"));
  ASSERT_FALSE(down.ok());
  EXPECT_FALSE(IsEpisodeLost(down.status()));
  auto second = std::make_unique<RunningServer>(zmq, endpoint);
  ASSERT_TRUE(second->bound().ok()) << second->bound().ToString();
  StatusOr<env::ToolResult> lost = UnavailableError("unset");
  for (int i = 0; i < 20; ++i) {  // ZeroMQ reconnects in the background (100 ms intervals)
    lost = client.Step(ep->id, Calculate("1+1"));
    if (lost.status().code() == StatusCode::kNotFound) break;
  }
  EXPECT_TRUE(IsEpisodeLost(lost.status())) << lost.status().ToString();
  // Re-issuing the task works on the new incarnation.
  auto again = client.Reset("calc", env::Split::kTrain, 0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->task.id, ep->task.id);
  EXPECT_NE(EpisodeIncarnation(again->id), EpisodeIncarnation(ep->id));
}

TEST(EnvServerTest, EpisodeIdsNameTheirIncarnation) {
  EXPECT_EQ(EpisodeIncarnation("00000000000000ff-3"), 255u);
  EXPECT_EQ(EpisodeIncarnation("00000000000000fF-3"), 0u);
  EXPECT_EQ(EpisodeIncarnation("short-3"), 0u);
  EXPECT_EQ(EpisodeIncarnation("00000000000000ff3"), 0u);
}

}  // namespace
}  // namespace orrery::envserver
