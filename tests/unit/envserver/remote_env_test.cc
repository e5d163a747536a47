// RemoteEnv: the agent loop driving episodes on an env server through real ZeroMQ sockets (tcp
// loopback): task ids are the server's, slow remote tool calls of many episodes overlap, and the
// three environment faults arrive as the loop's fault statuses — a tool error of the environment,
// a call past its deadline, and an episode lost when its server restarts mid-call.
#include "actors/envserver/remote_env.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <zmq.hpp>

#include "actors/envserver/server.h"
#include "env/calc/calc_env.h"
#include "rollout/agent_loop.h"
#include "tests/unit/rollout/agent_test_util.h"

namespace orrery::envserver {
namespace {

using rollout::AgentLoop;
using rollout::AgentOptions;
using rollout::EpisodeStatus;
using rollout::Trajectory;
using rollout::TrajectoryGroup;

// What the served environment's Step does before the calc step (shared with the test).
struct StepBehaviour {
  double sleep_s = 0;  // bounded by the call's deadline, as env/env.h requires
  Status status;       // non-OK: the environment fails the call
};

// The calc environment (name "calc") whose steps sleep and fail as told.
class ScriptedCalcEnv : public env::Env {
 public:
  explicit ScriptedCalcEnv(std::shared_ptr<StepBehaviour> b)
      : inner_(calc::MakeCalcEnv(rollout::CalcFixture::Options())), b_(std::move(b)) {}
  std::string name() const override { return "calc"; }
  StatusOr<env::TaskRef> Task(env::Split split, uint64_t index) const override {
    return inner_->Task(split, index);
  }
  StatusOr<std::unique_ptr<env::Episode>> Reset(const env::TaskRef& task,
                                                env::Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<env::Episode> e, inner_->Reset(task, deadline));
    return std::unique_ptr<env::Episode>(std::make_unique<Episode>(b_, std::move(e)));
  }

 private:
  class Episode : public env::Episode {
   public:
    Episode(std::shared_ptr<StepBehaviour> b, std::unique_ptr<env::Episode> inner)
        : b_(std::move(b)), inner_(std::move(inner)) {}
    const std::vector<ChatMessage>& initial_messages() const override {
      return inner_->initial_messages();
    }
    const std::vector<env::ToolSpec>& tools() const override { return inner_->tools(); }
    StatusOr<env::ToolResult> Step(const ToolCall& call, env::Deadline deadline) override {
      const auto until =
          std::min(deadline, env::Clock::now() + std::chrono::duration_cast<env::Clock::duration>(
                                                     std::chrono::duration<double>(b_->sleep_s)));
      std::this_thread::sleep_until(until);
      if (env::SecondsLeft(deadline) <= 0) return DeadlineExceededError("step: deadline passed");
      if (!b_->status.ok()) return b_->status;
      return inner_->Step(call, deadline);
    }
    StatusOr<env::EpisodeScore> Score(const std::vector<ChatMessage>& t,
                                      env::Deadline deadline) override {
      return inner_->Score(t, deadline);
    }

   private:
    std::shared_ptr<StepBehaviour> b_;
    std::unique_ptr<env::Episode> inner_;
  };
  std::unique_ptr<env::Env> inner_;
  std::shared_ptr<StepBehaviour> b_;
};

// A server of ScriptedCalcEnv on its own thread, stopped and joined by Stop or the destructor.
class RunningServer {
 public:
  RunningServer(zmq::context_t& zmq, const std::string& endpoint,
                std::shared_ptr<StepBehaviour> b) {
    std::vector<std::unique_ptr<env::Env>> envs;
    envs.push_back(std::make_unique<ScriptedCalcEnv>(std::move(b)));
    EnvServerOptions options;
    options.workers = 16;
    server_ = std::make_unique<EnvServer>(zmq, "env:test", std::move(envs), options);
    bound_ = server_->Bind(endpoint);
    if (bound_.ok()) thread_ = std::thread([this] { (void)server_->Run(stop_); });
  }
  ~RunningServer() { Stop(); }
  void Stop() {
    stop_.Cancel();
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  const Status& bound() const { return bound_; }
  const std::string& endpoint() const { return server_->endpoint(); }

 private:
  std::unique_ptr<EnvServer> server_;
  Cancellation stop_;
  Status bound_;
  std::thread thread_;
};

struct Scripts {
  rollout::CalcFixture f;
  std::vector<int32_t> OneCall() {
    std::vector<int32_t> s = f.TurnIds(f.ToolCallTurn());
    auto answer = f.TurnIds(f.AnswerTurn(f.calc_task.answer_text));
    s.insert(s.end(), answer.begin(), answer.end());
    return s;
  }
  std::vector<int32_t> TwoCalls() {
    std::vector<int32_t> s = f.TurnIds(f.ToolCallTurn());
    auto again = f.TurnIds(f.ToolCallTurn());
    s.insert(s.end(), again.begin(), again.end());
    auto answer = f.TurnIds(f.AnswerTurn(f.calc_task.answer_text));
    s.insert(s.end(), answer.begin(), answer.end());
    return s;
  }
};

std::unique_ptr<env::Env> Remote(zmq::context_t& zmq, const std::string& endpoint) {
  auto env = CreateRemoteEnv(zmq, "rollout:test", {"calc", {endpoint}});
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return std::move(*env);
}

TEST(RemoteEnv, SlowRemoteToolCallsOfManyEpisodesOverlap) {
  zmq::context_t zmq;
  auto b = std::make_shared<StepBehaviour>();
  b->sleep_s = 1.0;
  RunningServer server(zmq, "tcp://127.0.0.1:*", b);
  ASSERT_TRUE(server.bound().ok()) << server.bound().ToString();
  std::unique_ptr<env::Env> env = Remote(zmq, server.endpoint());
  Scripts s;
  // Task ids and seeds come from the server: the same as the local environment's.
  auto task = env->Task(env::Split::kTrain, 4);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(task->id, s.f.task.id);
  EXPECT_EQ(task->seed, s.f.task.seed);

  rollout::ScriptedBackend backend(16, s.f.tokenizer.vocab_size(), {s.TwoCalls()});
  AgentOptions o;
  o.max_turn_tokens = 200;
  o.max_episode_tokens = 4000;
  o.env_workers = 16;
  AgentLoop loop(&backend, s.f.format.get(), env.get(), o);
  loop.AddGroup(*task, 1, 16);
  const auto start = std::chrono::steady_clock::now();
  auto groups = loop.RunUntilIdle();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 1u);
  for (const Trajectory& t : (*groups)[0].trajectories) {
    EXPECT_EQ(t.status, EpisodeStatus::kFinished);
    EXPECT_EQ(t.task_id, s.f.task.id);
    ASSERT_EQ(t.tool_calls.size(), 2u);
    EXPECT_EQ(t.tool_calls[1].result, s.f.calc_task.answer_text);
    EXPECT_EQ(t.reward, 1.0);
  }
  std::printf("remote: 16 episodes x 2 tool calls of 1 s: %.2f s\n", seconds);
  EXPECT_LT(seconds, 8.0);  // generous: 2 s of tool time; 32 s in series
}

// One episode that calls the tool once, on `env`; returns its trajectory.
Trajectory RunOneCall(rollout::ScriptedBackend& backend, Scripts& s, env::Env* env,
                      double timeout_s) {
  AgentOptions o;
  o.max_turn_tokens = 200;
  o.max_episode_tokens = 2000;
  o.env_workers = 1;
  o.env_timeout_seconds = timeout_s;
  AgentLoop loop(&backend, s.f.format.get(), env, o);
  loop.AddGroup(s.f.task, 1, 1);
  auto groups = loop.RunUntilIdle();
  EXPECT_TRUE(groups.ok()) << groups.status().ToString();
  if (!groups.ok() || groups->size() != 1) return Trajectory{};
  return (*groups)[0].trajectories[0];
}

TEST(RemoteEnv, EnvironmentToolErrorAndTimeoutAreFaults) {
  zmq::context_t zmq;
  auto b = std::make_shared<StepBehaviour>();
  RunningServer server(zmq, "tcp://127.0.0.1:*", b);
  ASSERT_TRUE(server.bound().ok());
  std::unique_ptr<env::Env> env = Remote(zmq, server.endpoint());
  Scripts s;
  {
    b->status = InternalError("the sandbox could not start");
    rollout::ScriptedBackend backend(1, s.f.tokenizer.vocab_size(), {s.OneCall()});
    Trajectory t = RunOneCall(backend, s, env.get(), 5.0);
    EXPECT_EQ(t.status, EpisodeStatus::kToolError);
    ASSERT_EQ(t.tool_calls.size(), 1u);
    EXPECT_NE(t.tool_calls[0].error.find("the sandbox could not start"), std::string::npos)
        << t.tool_calls[0].error;
  }
  {
    b->status = Status::OK();
    b->sleep_s = 10;
    rollout::ScriptedBackend backend(1, s.f.tokenizer.vocab_size(), {s.OneCall()});
    const auto start = std::chrono::steady_clock::now();
    Trajectory t = RunOneCall(backend, s, env.get(), 0.5);
    EXPECT_EQ(t.status, EpisodeStatus::kTimeout) << t.tool_calls.at(0).error;
    EXPECT_TRUE(t.env_fault());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
}

TEST(RemoteEnv, AnEpisodeOfARestartedServerIsLost) {
  zmq::context_t zmq;
  auto b = std::make_shared<StepBehaviour>();
  b->sleep_s = 1.0;
  auto first = std::make_unique<RunningServer>(zmq, "tcp://127.0.0.1:*", b);
  ASSERT_TRUE(first->bound().ok());
  const std::string endpoint = first->endpoint();
  std::unique_ptr<env::Env> env = Remote(zmq, endpoint);
  Scripts s;
  // While the episode's step runs on the first server, that server stops (its reply is dropped)
  // and another starts at the same endpoint: the episode is gone with the first.
  std::unique_ptr<RunningServer> second;
  std::thread restart([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    first->Stop();
    // The port may not be free the instant the first server's socket closes (seen under load in
    // the full ctest): retry the bind for up to a second, well inside the episode's 2 s deadline.
    for (int attempt = 0; attempt < 20; ++attempt) {
      second = std::make_unique<RunningServer>(zmq, endpoint, b);
      if (second->bound().ok()) break;
      second.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  rollout::ScriptedBackend backend(1, s.f.tokenizer.vocab_size(), {s.OneCall()});
  Trajectory t = RunOneCall(backend, s, env.get(), 2.0);
  restart.join();
  ASSERT_TRUE(second != nullptr) << "the second server could not bind " << endpoint;
  EXPECT_EQ(t.status, EpisodeStatus::kEnvLost) << t.tool_calls.at(0).error;
  EXPECT_TRUE(t.env_fault());
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_NE(t.tool_calls[0].error.find("episode lost"), std::string::npos) << t.tool_calls[0].error;
}

}  // namespace
}  // namespace orrery::envserver
