// Coordinator, supervisor and fleet config: registry and lookups over a real mailbox, progress
// counters carried by heartbeats, child processes restarted with backoff until the budget is
// spent, hung children (silent, or heartbeating without progress) killed, process groups killed
// with their leader, shutdown that reaps everything, strict [fleet] parsing and the process plan.
#include "actors/coordinator/coordinator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "actors/coordinator/fleet_state.h"
#include "actors/coordinator/supervisor.h"
#include "actors/launch/emit.h"
#include "actors/launch/fleet_config.h"
#include "actors/launch/plan.h"
#include "actors/runtime/advertise.h"
#include "actors/runtime/client.h"
#include "actors/runtime/coordinator_protocol.h"
#include "actors/runtime/curve_auth.h"
#include "actors/runtime/curve_keys.h"
#include "actors/runtime/echo_role.h"
#include "actors/runtime/fleet_curve.h"
#include "actors/runtime/host.h"
#include "actors/runtime/progress_watchdog.h"
#include "actors/runtime/role.h"
#include "actors/runtime/wire.h"
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
  // The echo role's loop advances its progress counter (every 100 ms); heartbeats carry it.
  for (int attempt = 0; attempt < 500; ++attempt) {
    auto s = state.Snapshot();
    if (s[0].progress >= 2 && s[1].progress >= 2) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  for (const ActorRecord& r : state.Snapshot()) {
    EXPECT_GE(r.progress, 2u) << r.name;
    EXPECT_GT(r.last_progress_ms, 0) << r.name;
  }
  // A handler that blocks echo:0's loop for 1.5 s: its heartbeats go on, its counter stops (the
  // timer runs on the loop; unblocked it would advance ~15 times), then it moves again.
  {
    ActorClient echo(zmq, "test-echo");
    ASSERT_TRUE(echo.Connect("inproc://echo-coord-0").ok());
    const uint64_t before = state.Get("echo:0")->progress;
    const int64_t call_ms = UnixMillis();
    auto slow = echo.Call<schema::EchoRequest, schema::EchoReply>(
        kEchoMethod,
        [](schema::EchoRequest::Builder r) {
          r.setText("slow");
          r.setSleepMs(1500);
        },
        CallOptions{milliseconds(10000), nullptr});
    ASSERT_TRUE(slow.ok()) << slow.status().ToString();
    const ActorRecord during = *state.Get("echo:0");
    EXPECT_LE(during.progress, before + 3) << "the counter advanced while the loop was blocked";
    EXPECT_GT(during.last_heartbeat_ms, call_ms + 1000) << "heartbeats stopped with the loop";
    for (int attempt = 0; attempt < 500 && state.Get("echo:0")->progress < during.progress + 2;
         ++attempt) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    EXPECT_GE(state.Get("echo:0")->progress, during.progress + 2);
  }

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

// Heartbeats every supervised child (by its current pid) every 10 ms from a thread, standing in
// for the children's heartbeat threads; `progress(name, beats)` is the counter to report after
// `beats` heartbeats of this incarnation.
class FakeHeartbeats {
 public:
  FakeHeartbeats(FleetState& state, std::function<uint64_t(const std::string&, uint64_t)> progress)
      : thread_([this, &state, progress = std::move(progress)] {
          std::map<int64_t, uint64_t> beats;  // by pid
          while (!done_.load()) {
            for (const ActorRecord& r : state.Snapshot()) {
              if (r.pid <= 0) continue;
              const uint64_t n = ++beats[r.pid];
              state.Heartbeat(r.name, r.pid, /*ready=*/true, progress(r.name, n));
            }
            std::this_thread::sleep_for(milliseconds(10));
          }
        }) {}
  ~FakeHeartbeats() {
    done_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(Supervisor, KillsAndRestartsAChildWhoseProgressStalls) {
  FleetState state;
  SupervisorOptions o;
  o.startup_timeout = milliseconds(60000);
  // Heartbeats never stop here (every 10 ms): only progress counts. These children have no
  // watchdog of their own, so the supervisor's backstop kills them: after progress_timeout +
  // heartbeat_timeout = 2500 ms without progress.
  o.heartbeat_timeout = milliseconds(2000);
  o.progress_timeout = milliseconds(500);
  o.backoff_initial = milliseconds(10);
  o.restart_budget = 1;  // the second stall spends it and ends Run
  o.shutdown_grace = milliseconds(2000);
  Supervisor supervisor(state, o,
                        {Shell("stuck:0", "exec sleep 30"), Shell("steady:0", "exec sleep 30"),
                         Shell("quiet:0", "exec sleep 30")});
  FakeHeartbeats beats(state, [](const std::string& name, uint64_t n) -> uint64_t {
    if (name == "stuck:0") return std::min<uint64_t>(n, 10);  // advances, then its loop hangs
    if (name == "steady:0") return n;                         // advances every beat
    return 0;  // quiet:0 never reports progress: not watched
  });
  Cancellation stop;
  std::thread stopper([&] {  // bounds the test when stalls are not detected
    stop.WaitFor(milliseconds(15000));
    stop.Cancel();
  });
  Status s = supervisor.Run(stop);
  stop.Cancel();
  stopper.join();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("stuck:0 was restarted 1 times"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("no progress for"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("counter at 10"), std::string::npos) << s.message();
  auto stuck = state.Get("stuck:0");
  EXPECT_EQ(stuck->restarts, 1);
  EXPECT_EQ(stuck->state, ActorState::kFailed);
  // Watched for two stalls (> 2 x 2500 ms) without being touched; stopped by the shutdown.
  for (const char* name : {"steady:0", "quiet:0"}) {
    auto r = state.Get(name);
    EXPECT_EQ(r->restarts, 0) << name;
    EXPECT_EQ(r->state, ActorState::kStopped) << name;
    EXPECT_EQ(r->last_exit.find("no progress"), std::string::npos) << name << ": " << r->last_exit;
  }
}

// Whether `pid` is gone: no such process, or a zombie (killed, not yet reaped by its new parent).
bool ProcessGone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

TEST(Supervisor, KillsTheProcessGroupOfAChildThatExits) {
  const std::string pid_file =
      "/tmp/orrery_supervisor_group_test_" + std::to_string(getpid()) + ".pid";
  std::remove(pid_file.c_str());
  FleetState state;
  SupervisorOptions o;
  o.startup_timeout = milliseconds(60000);
  // The shell starts a grandchild in its own process group and exits at once.
  Supervisor supervisor(
      state, o,
      {Shell("leader:0", "sleep 30 & echo $! > " + pid_file + "; exit 1", RestartPolicy::kNever)});
  Cancellation stop;
  Status s = supervisor.Run(stop);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("leader:0 ended: exit 1"), std::string::npos) << s.message();
  std::ifstream in(pid_file);
  pid_t grandchild = 0;
  ASSERT_TRUE(in >> grandchild);
  ASSERT_GT(grandchild, 0);
  // SIGKILL went to the group before the exit was reported; its delivery is asynchronous.
  bool gone = false;
  for (int attempt = 0; attempt < 200 && !(gone = ProcessGone(grandchild)); ++attempt) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(gone) << "grandchild " << grandchild << " outlived its group leader";
  if (!gone) kill(grandchild, SIGKILL);
  std::remove(pid_file.c_str());
}

TEST(Supervisor, SaysWhenAChildsWatchdogEndedIt) {
  FleetState state;
  SupervisorOptions o;
  o.startup_timeout = milliseconds(60000);
  Supervisor supervisor(
      state, o,
      {Shell("stalled:0", "exit " + std::to_string(kNoProgressExitCode), RestartPolicy::kNever)});
  Cancellation stop;
  Status s = supervisor.Run(stop);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("stalled:0 ended: exit 75: its watchdog saw no progress for "
                             "fleet.progress_timeout_ms"),
            std::string::npos)
      << s.message();
}

// The "stall" role's fleet, for the watchdog's death test (the role runs in the death test's
// child process, where this points at the coordinator's state).
FleetState* g_stall_fleet = nullptr;
constexpr int kStallAfter = 20;  // Progress() calls before the role's loop hangs

// Starts slowly (not watched before its first Progress()), advances its counter kStallAfter times
// 50 ms apart (under the timeout each), then hangs for 10 s ignoring stop, as a deadlocked loop
// would; its heartbeats go on from their own thread. Prints one line once it has seen a heartbeat
// arrive during the hang.
Status StallMain(ActorContext& ctx) {
  ctx.SetReady();
  std::this_thread::sleep_for(milliseconds(1500));
  for (int i = 0; i < kStallAfter; ++i) {
    ctx.Progress();
    std::this_thread::sleep_for(milliseconds(50));
  }
  const int64_t hang_ms = UnixMillis();
  bool told = false;
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    std::optional<ActorRecord> r = g_stall_fleet->Get(ctx.name());
    if (!told && r && r->last_heartbeat_ms > hang_ms + 200) {
      std::fprintf(stderr, "heartbeats go on during the hang\n");
      told = true;
    }
  }
  return Status::OK();  // what today's actor did after 10 s: exit 0, never ended
}

// An actor process as Slurm and Kubernetes run one: a coordinator to heartbeat to, no
// supervisor. Exits with RunActor's outcome unless something ends it first.
[[noreturn]] void RunStallingActorProcess(const std::string& dir) {
  RegisterActorRole({"stall", "hangs after a few progress calls (coordinator_test)", StallMain});
  zmq::context_t zmq;
  FleetState state;
  g_stall_fleet = &state;
  auto server = CoordinatorServer::Start(zmq, "inproc://stall-coordinator", state);
  if (!server.ok()) std::_Exit(2);
  ActorHostOptions o;
  o.role = "stall";
  o.endpoint = "inproc://stall-0";
  o.coordinator = "inproc://stall-coordinator";
  o.run_dir = dir;
  o.heartbeat = milliseconds(50);
  o.progress_timeout = milliseconds(1000);
  Cancellation stop;
  const Status s = RunActor(zmq, o, stop);
  std::_Exit(s.ok() ? 0 : 1);
}

// The watchdog ends the process (one line, exit 75) once the counter has stood still for the
// timeout; the slow start before the first Progress() and the advancing loop are left alone (the
// line names the counter's final value). Without it the process exits 0 after the 10 s hang.
TEST(ProgressWatchdogDeathTest, EndsAnActorProcessWhoseLoopHangsWithoutASupervisor) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child runs the coordinator's threads too
  // One path for the parent and the child (re-executed, with a pid of its own).
  const std::string dir =
      (std::filesystem::temp_directory_path() / "orrery_watchdog_test").string();
  EXPECT_EXIT(RunStallingActorProcess(dir), testing::ExitedWithCode(kNoProgressExitCode),
              "heartbeats go on during the hang\n.*\\[stall:0\\] no progress for [0-9]+ ms "
              "\\(counter at 20, --progress-timeout-ms 1000\\): the role's main loop is stuck; "
              "ending the process \\(exit 75\\)");
  std::filesystem::remove_all(dir);
}

// The coordinator on tcp with the fleet's keys: an actor holding them registers; a stranger (no
// keys, or another fleet's) gets no reply, registers nothing and is counted; heartbeats carry each
// actor's count of refused peers to the fleet metrics, across restarts of the actor.
TEST(Coordinator, TcpCoordinatorRegistersOnlyTheFleet) {
  ASSERT_TRUE(CheckCurveAvailable().ok());
  const CurveKeyPair keys = *GenerateCurveKeyPair();
  SetFleetCurveKeys(keys);
  zmq::context_t zmq;
  FleetState state;
  auto server = CoordinatorServer::Start(zmq, "tcp://127.0.0.1:*", state);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string endpoint = (*server)->endpoint();

  auto try_register = [&](const std::string& name) {
    zmq::context_t own;  // another process
    ActorClient client(own, name);
    EXPECT_TRUE(client.Connect(endpoint).ok());
    return client.Call<schema::RegisterRequest, schema::HeartbeatReply>(
        coordinator_methods::kRegister,
        [&](schema::RegisterRequest::Builder req) {
          req.setName(name);
          req.setRole("echo");
          req.setEndpoint("tcp://10.0.0.1:9");
          req.setPid(4242);
          req.setReady(true);
        },
        {milliseconds(1000), nullptr});
  };
  const uint64_t before = CurveRefusedTotal();
  SetFleetCurveKeys(std::nullopt);  // a plain stranger
  auto plain = try_register("fake:0");
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), StatusCode::kDeadlineExceeded);
  SetFleetCurveKeys(*GenerateCurveKeyPair());  // another fleet's keys
  auto other = try_register("fake:1");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(state.Snapshot().empty()) << state.Snapshot()[0].name;
  EXPECT_GT(CurveRefusedTotal(), before);

  SetFleetCurveKeys(keys);
  auto member = try_register("echo:0");
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  EXPECT_TRUE(member->get().getKnown());
  ASSERT_EQ(state.Snapshot().size(), 1u);
  EXPECT_EQ(state.Snapshot()[0].name, "echo:0");
  SetFleetCurveKeys(std::nullopt);

  // Refusal counts: per incarnation as heartbeated, summed over incarnations, plus the launcher's.
  ASSERT_TRUE(state.Heartbeat("echo:0", 4242, true, 1, 3));
  ASSERT_TRUE(state.Heartbeat("echo:0", 4242, true, 2, 5));
  state.MarkSpawned("echo:0", 4343);  // restarted: the new process counts from 0
  ASSERT_TRUE(state.Heartbeat("echo:0", 4343, true, 1, 2));
  double actor = -1, total = -1;
  for (const MetricRecord& m : state.ToMetrics(0, 10)) {
    if (m.source == "echo:0") actor = m.scalars.at("fleet/auth_refused");
    if (m.source == "coordinator") total = m.scalars.at("fleet/auth_refused_total");
  }
  EXPECT_EQ(actor, 7);
  EXPECT_EQ(total, 17);
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

// Where each launcher's actors are reached, which is also where the learner ranks' Gloo sockets
// listen (actors/rl/learner_comm.h): fleet.host for a local tcp fleet, 127.0.0.1 for an ipc one;
// the cluster renderings bind tcp://*:PORT and advertise ORRERY_ADVERTISE_HOST (the pod IP in
// the k8s manifests) or the node's host name (Slurm). Both renderings, like the local plan, pass
// fleet.progress_timeout_ms to every actor.
TEST(FleetPlan, ActorsAdvertiseTheFleetsAddressAndWatchTheirProgress) {
  RegisterEchoRole();
  RunConfig run;
  run.dir = "/tmp/r";
  auto tcp = ParseFleet(
      "[fleet]\ntransport = \"tcp\"\nhost = \"10.1.2.3\"\n[[fleet.roles]]\nrole = \"echo\"\n");
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  auto tcp_plan = BuildFleetPlan(*tcp, run, "/etc/run.toml", "/bin/orrery");
  ASSERT_TRUE(tcp_plan.ok());
  EXPECT_EQ(AdvertisedHost(tcp_plan->processes[0].endpoint), "10.1.2.3");
  auto ipc = ParseFleet("[fleet]\n[[fleet.roles]]\nrole = \"echo\"\n");
  ASSERT_TRUE(ipc.ok());
  auto ipc_plan = BuildFleetPlan(*ipc, run, "/etc/run.toml", "/bin/orrery");
  ASSERT_TRUE(ipc_plan.ok());
  EXPECT_EQ(AdvertisedHost(ipc_plan->processes[0].endpoint), "127.0.0.1");
  EXPECT_EQ(AdvertisedHost("inproc://echo-0"), "127.0.0.1");
  EXPECT_EQ(AdvertisedHost("tcp://[fd00::7]:5601"), "fd00::7");

  const std::string fleet_text =
      "[fleet]\ntransport = \"tcp\"\nbase_port = 6300\nprogress_timeout_ms = 4000\n"
      "[[fleet.roles]]\nrole = \"echo\"\n";
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("orrery_emit_test_" + std::to_string(getpid()) + ".toml"))
                               .string();
  { std::ofstream(path) << "[run]\nname = \"emit\"\ndir = \"runs/emit\"\n" << fleet_text; }
  auto cluster = ParseFleet(fleet_text);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  run.dir = "runs/emit";
  auto slurm = EmitLaunchFiles("slurm", *cluster, run, path);
  ASSERT_TRUE(slurm.ok()) << slurm.status().ToString();
  EXPECT_NE(slurm->find("--endpoint \"tcp://*:$((port + index))\""), std::string::npos) << *slurm;
  EXPECT_NE(slurm->find("--progress-timeout-ms 4000"), std::string::npos) << *slurm;
  auto k8s = EmitLaunchFiles("k8s", *cluster, run, path);
  ASSERT_TRUE(k8s.ok()) << k8s.status().ToString();
  EXPECT_NE(k8s->find("--endpoint 'tcp://*:6301'"), std::string::npos) << *k8s;
  EXPECT_NE(k8s->find("--progress-timeout-ms 4000"), std::string::npos) << *k8s;
  EXPECT_NE(k8s->find("name: ORRERY_ADVERTISE_HOST"), std::string::npos) << *k8s;
  std::remove(path.c_str());

  // What such a wildcard endpoint advertises: the pod IP, else the host name.
  const char* saved = std::getenv("ORRERY_ADVERTISE_HOST");
  const std::string kept = saved != nullptr ? saved : "";
  setenv("ORRERY_ADVERTISE_HOST", "10.9.8.7", 1);
  EXPECT_EQ(AdvertisedHost("tcp://*:6301"), "10.9.8.7");
  EXPECT_EQ(AdvertisedEndpoint("tcp://*:6301"), "tcp://10.9.8.7:6301");
  EXPECT_EQ(AdvertisedEndpoint("tcp://10.1.2.3:6301"), "tcp://10.1.2.3:6301");
  unsetenv("ORRERY_ADVERTISE_HOST");
  EXPECT_EQ(AdvertisedHost("tcp://*:6301"), LocalHostName());
  EXPECT_NE(LocalHostName(), "");
  if (saved != nullptr) setenv("ORRERY_ADVERTISE_HOST", kept.c_str(), 1);
}

// The launcher's fleet records are what the dashboard reads (docs/dashboard.md): under each
// actor's own name, fleet/state and fleet/restarts_total, the replay store's too.
TEST(FleetMetrics, EachActorUnderItsOwnNameWithTheDashboardsSeries) {
  FleetState state;
  state.Register("replay:0", "replay", 0, "ipc://r", "h", 10, true, 1);
  state.Register("rollout:0", "rollout", 0, "ipc://o", "h", 11, true, 1);
  state.MarkDown("rollout:0", ActorState::kBackoff, "killed by signal 9", true);
  std::map<std::string, std::map<std::string, double>> by_source;
  for (const MetricRecord& m : state.ToMetrics(0)) by_source[m.source] = m.scalars;
  ASSERT_TRUE(by_source.count("replay:0") && by_source.count("rollout:0"));
  EXPECT_EQ(by_source["replay:0"].at("fleet/state"), 1);  // running
  EXPECT_EQ(by_source["replay:0"].at("fleet/restarts_total"), 0);
  EXPECT_EQ(by_source["rollout:0"].at("fleet/state"), 2);  // restarting
  EXPECT_EQ(by_source["rollout:0"].at("fleet/restarts_total"), 1);
  // No second series of the same name sums them (a Prometheus sum() would count them twice).
  EXPECT_EQ(by_source["coordinator"].count("fleet/restarts_total"), 0u);
  EXPECT_EQ(by_source["coordinator"].at("fleet/actors_backoff"), 1);
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
  EXPECT_EQ(ok->progress_timeout_ms, 120000);
  auto off = ParseFleet("[fleet]\nprogress_timeout_ms = 0\n[[fleet.roles]]\nrole = \"echo\"\n");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->progress_timeout_ms, 0);

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
  expect_error(
      "[fleet]\nheartbeat_ms = 500\nprogress_timeout_ms = 600\n"
      "[[fleet.roles]]\nrole = \"echo\"\n",
      "fleet.progress_timeout_ms");
  expect_error(
      "[fleet]\nheartbeat_ms = 500\nprogress_timeout_ms = 600\n"
      "[[fleet.roles]]\nrole = \"echo\"\n",
      "must be 0 (off) or at least twice fleet.heartbeat_ms (1000), got 600");
  expect_error("[fleet]\nprogress_timeout_ms = -1\n[[fleet.roles]]\nrole = \"echo\"\n",
               "fleet.progress_timeout_ms");
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
  // Every actor watches its own progress with the fleet's timeout.
  auto timeout_flag = std::find(argv.begin(), argv.end(), "--progress-timeout-ms");
  ASSERT_NE(timeout_flag, argv.end());
  EXPECT_EQ(*(timeout_flag + 1), "120000");
  EXPECT_NE(FormatFleetPlan(*plan).find("echo:2"), std::string::npos);
  // A tcp fleet passes its CURVE key directory (default: under run.dir) to every actor.
  EXPECT_EQ(plan->curve_key_dir, "/tmp/r/curve");
  auto key_flag = std::find(argv.begin(), argv.end(), "--curve-key-dir");
  ASSERT_NE(key_flag, argv.end());
  EXPECT_EQ(*(key_flag + 1), "/tmp/r/curve");
  auto keyed = ParseFleet(
      "[fleet]\ntransport = \"tcp\"\ncurve_key_dir = \"/etc/orrery/curve\"\n"
      "[[fleet.roles]]\nrole = \"echo\"\n");
  ASSERT_TRUE(keyed.ok());
  EXPECT_EQ(BuildFleetPlan(*keyed, run, "/etc/run.toml", "/bin/orrery")->curve_key_dir,
            "/etc/orrery/curve");
  // An ipc fleet authenticates by file permissions: no keys.
  auto ipc = ParseFleet("[fleet]\n[[fleet.roles]]\nrole = \"echo\"\n");
  ASSERT_TRUE(ipc.ok());
  auto ipc_plan = BuildFleetPlan(*ipc, run, "/etc/run.toml", "/bin/orrery");
  EXPECT_EQ(ipc_plan->curve_key_dir, "");
  for (const std::string& a : ipc_plan->processes[0].argv) EXPECT_NE(a, "--curve-key-dir");
  // A tcp metrics hub makes the fleet use tcp too.
  auto hub = ParseFleet(
      "[fleet]\nmetrics_endpoint = \"tcp://127.0.0.1:5570\"\n[[fleet.roles]]\nrole = \"echo\"\n");
  ASSERT_TRUE(hub.ok());
  EXPECT_TRUE(FleetUsesTcp(*hub));
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote("tcp://a:1"), "tcp://a:1");
}

}  // namespace
}  // namespace orrery
