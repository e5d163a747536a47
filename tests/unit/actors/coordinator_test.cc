// Coordinator, supervisor and fleet config: registry and lookups over a real mailbox, child
// processes restarted with backoff until the budget is spent, hung children killed, shutdown that
// reaps everything, strict [fleet] parsing and the process plan.
#include "actors/coordinator/coordinator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "actors/coordinator/fleet_state.h"
#include "actors/coordinator/supervisor.h"
#include "actors/launch/fleet_config.h"
#include "actors/launch/plan.h"
#include "actors/runtime/client.h"
#include "actors/runtime/echo_role.h"
#include "actors/runtime/host.h"
#include "actors/schema/actor.capnp.h"

namespace orrery {
namespace {

using std::chrono::milliseconds;

TEST(Coordinator, ActorsRegisterHeartbeatAndFindEachOther) {
  RegisterEchoRole();
  zmq::context_t zmq;
  FleetState state;
  auto server = CoordinatorServer::Start(zmq, "inproc://coordinator-test", state);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string dir = "/tmp/orrery_coordinator_test_" + std::to_string(getpid());
  std::vector<std::unique_ptr<ActorThread>> actors;
  for (int i = 0; i < 2; ++i) {
    ActorHostOptions o;
    o.role = "echo";
    o.index = i;
    o.endpoint = "inproc://echo-coord-" + std::to_string(i);
    o.coordinator = "inproc://coordinator-test";
    o.run_dir = dir;
    o.heartbeat = milliseconds(20);
    actors.push_back(ActorThread::Start(zmq, o));
  }
  // Both register and become ready.
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto snap = state.Snapshot();
    if (snap.size() == 2 && snap[0].state == ActorState::kRunning &&
        snap[1].state == ActorState::kRunning)
      break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  auto snap = state.Snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].name, "echo:0");
  EXPECT_EQ(snap[0].state, ActorState::kRunning);
  EXPECT_EQ(snap[1].endpoint, "inproc://echo-coord-1");
  EXPECT_GT(snap[1].last_heartbeat_ms, 0);

  // Lookups by name and by role (spread over the instances), through the mailbox.
  ActorClient client(zmq, "test");
  ASSERT_TRUE(client.Connect("inproc://coordinator-test").ok());
  auto lookup = [&](const std::string& key) {
    return client.Call<schema::LookupRequest, schema::LookupReply>(
        "coordinator.Lookup", [&](schema::LookupRequest::Builder r) { r.setName(key); });
  };
  auto by_name = lookup("echo:1");
  ASSERT_TRUE(by_name.ok()) << by_name.status().ToString();
  EXPECT_EQ(std::string(by_name->get().getEndpoint().cStr()), "inproc://echo-coord-1");
  auto a = lookup("echo"), b = lookup("echo");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(std::string(a->get().getName().cStr()), std::string(b->get().getName().cStr()));
  EXPECT_EQ(lookup("replay").status().code(), StatusCode::kNotFound);

  // Run state set by one actor reaches the others with their heartbeats; "stopping" stops them.
  state.SetRunState("rl", 2, 17);
  state.SetStopping();
  for (auto& t : actors) {
    for (int attempt = 0; attempt < 200 && !t->finished(); ++attempt)
      std::this_thread::sleep_for(milliseconds(10));
    EXPECT_TRUE(t->finished()) << "an actor ignored the fleet's stop";
    EXPECT_TRUE(t->Stop().ok());
  }
  auto status = client.Call<schema::Empty, schema::FleetStatus>("coordinator.Status",
                                                                [](schema::Empty::Builder) {});
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->get().getActors().size(), 2u);
  EXPECT_EQ(status->get().getRunState().getPolicyVersion(), 17u);
  EXPECT_TRUE(status->get().getRunState().getStopping());
}

ProcessSpec Shell(const std::string& name, const std::string& script,
                  RestartPolicy restart = RestartPolicy::kAlways) {
  ProcessSpec p;
  p.name = name;
  p.role = "sh";
  p.argv = {"/bin/sh", "-c", script};
  p.restart = restart;
  return p;
}

TEST(Supervisor, RestartsWithBackoffUntilTheBudgetIsSpent) {
  FleetState state;
  SupervisorOptions o;
  o.backoff_initial = milliseconds(20);
  o.backoff_max = milliseconds(80);
  o.restart_budget = 3;
  o.startup_timeout = milliseconds(60000);
  Supervisor supervisor(state, o, {Shell("crashy:0", "exit 3")});
  Cancellation stop;
  const auto start = std::chrono::steady_clock::now();
  Status s = supervisor.Run(stop);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("crashy:0 was restarted 3 times"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("exit 3"), std::string::npos);
  // Backoffs 20 + 40 + 80 ms.
  EXPECT_GE(took, milliseconds(140));
  auto r = state.Get("crashy:0");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->restarts, 3);
  EXPECT_EQ(r->state, ActorState::kFailed);
}

TEST(Supervisor, KillsSilentChildrenAndStopsEverythingOnCancel) {
  FleetState state;
  SupervisorOptions o;
  o.startup_timeout = milliseconds(150);  // these children never register
  o.backoff_initial = milliseconds(10);
  o.restart_budget = 100;
  o.shutdown_grace = milliseconds(2000);
  Supervisor supervisor(
      state, o,
      {Shell("silent:0", "exec sleep 30"), Shell("done:0", "exit 0", RestartPolicy::kOnFailure)});
  Cancellation stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(600));
    stop.Cancel();
  });
  Status s = supervisor.Run(stop);
  stopper.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto silent = state.Get("silent:0");
  ASSERT_TRUE(silent.has_value());
  EXPECT_GE(silent->restarts, 1);  // killed for silence at least once
  EXPECT_EQ(silent->state, ActorState::kStopped);
  EXPECT_EQ(kill(static_cast<pid_t>(silent->pid), 0), -1);  // reaped: no such process
  auto done = state.Get("done:0");
  EXPECT_EQ(done->state, ActorState::kExited);
  EXPECT_EQ(done->restarts, 0);
  EXPECT_TRUE(state.run_state().stopping);
}

StatusOr<FleetConfig> ParseFleet(const std::string& text) {
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseString(text, "fleet.toml"));
  ConfigTable root = doc.root();
  RunConfig run;
  run.dir = "/tmp/r";
  FleetConfig c = ReadFleetConfig(root, run);
  ORRERY_RETURN_IF_ERROR(doc.Finish());
  return c;
}

TEST(FleetConfig, ReadsRolesAndRejectsBadFleets) {
  RegisterEchoRole();
  auto ok = ParseFleet(
      "[fleet]\ntransport = \"tcp\"\nbase_port = 7000\n"
      "[[fleet.roles]]\nrole = \"echo\"\ncount = 2\nrestart = \"on-failure\"\n");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->coordinator, "tcp://127.0.0.1:7000");
  ASSERT_EQ(ok->roles.size(), 1u);
  EXPECT_EQ(ok->roles[0].restart, RestartPolicy::kOnFailure);

  auto expect_error = [](const std::string& text, const std::string& want) {
    auto c = ParseFleet(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << c.status().message();
  };
  expect_error("[fleet]\n", "the fleet has no actors");
  expect_error("[fleet]\n[[fleet.roles]]\nrole = \"echo\"\ncount = 0\n", "no actors");
  expect_error("[fleet]\n[[fleet.roles]]\nrole = \"x\"\n", "fleet.toml:3: fleet.roles");
  expect_error("[fleet]\n[[fleet.roles]]\nrole = \"x\"\n", "unknown role 'x'");
  expect_error("[fleet]\n[[fleet.roles]]\nrole = \"echo\"\n[[fleet.roles]]\nrole = \"echo\"\n",
               "appears twice");
  expect_error(
      "[fleet]\nheartbeat_ms = 500\nheartbeat_timeout_ms = 600\n"
      "[[fleet.roles]]\nrole = \"echo\"\n",
      "at least twice fleet.heartbeat_ms");
  expect_error("[fleet]\ntransport = \"udp\"\n[[fleet.roles]]\nrole = \"echo\"\n",
               "fleet.transport");
  expect_error("[fleet]\nroles_typo = 1\n[[fleet.roles]]\nrole = \"echo\"\n",
               "unknown key 'fleet.roles_typo'");
}

TEST(FleetPlan, AssignsEndpointsAndCommandLines) {
  RegisterEchoRole();
  auto c = ParseFleet(
      "[fleet]\ntransport = \"tcp\"\nbase_port = 7000\n"
      "[[fleet.roles]]\nrole = \"echo\"\ncount = 3\n");
  ASSERT_TRUE(c.ok());
  RunConfig run;
  run.dir = "/tmp/r";
  auto plan = BuildFleetPlan(*c, run, "/etc/run.toml", "/bin/orrery");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->processes.size(), 3u);
  EXPECT_EQ(plan->processes[2].name, "echo:2");
  EXPECT_EQ(plan->processes[2].endpoint, "tcp://127.0.0.1:7003");
  const auto& argv = plan->processes[2].argv;
  EXPECT_EQ(argv[0], "/bin/orrery");
  EXPECT_EQ(argv[1], "actor");
  EXPECT_EQ(argv[2], "echo");
  EXPECT_NE(std::find(argv.begin(), argv.end(), "tcp://127.0.0.1:7000"), argv.end());
  EXPECT_NE(FormatFleetPlan(*plan).find("echo:2"), std::string::npos);
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote("tcp://a:1"), "tcp://a:1");
}

}  // namespace
}  // namespace orrery
