// A rollout-side client for env_serve_test.sh: drives calc episodes of a running `orrery env
// serve` (configured with [env.calc] seed = 3, difficulty = 2) through EnvClient.
//
//   env_serve_probe ENDPOINT episodes N   N full episodes, each rewarded 1; prints "ok N"
//   env_serve_probe ENDPOINT survive      opens an episode, prints "opened", then steps it until
//                                         the server was restarted ("episode lost"), re-issues
//                                         the task and finishes it; prints "recovered"
// Exit 0 on success; 1 with one line on stderr otherwise. Bounded: gives up after 30 s.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "actors/envserver/client.h"
#include "env/calc/task.h"

using namespace orrery;
using namespace orrery::envserver;

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "env_serve_probe: %s\n", what.c_str());
  return 1;
}

// One full episode of task `index`: the right calculate call, the right answer, reward 1.
Status RunEpisode(EnvClient& client, uint64_t index) {
  ORRERY_ASSIGN_OR_RETURN(RemoteEpisode ep, client.Reset("calc", env::Split::kTrain, index));
  ORRERY_ASSIGN_OR_RETURN(calc::CalcTask task, calc::MakeCalcTask(3, env::Split::kTrain, index, 2));
  ToolCall call{"call_0", "calculate", "{\"expression\": \"" + task.expression + "\"}"};
  ORRERY_ASSIGN_OR_RETURN(env::ToolResult result, client.Step(ep.id, call));
  if (result.is_error || result.content != task.answer_text) {
    return InternalError("step of task " + std::to_string(index) + " gave '" + result.content +
                         "', expected " + task.answer_text);
  }
  std::vector<ChatMessage> t = ep.messages;
  t.push_back(ChatMessage{ChatRole::kAssistant, "", {call}, "", ""});
  t.push_back(ChatMessage{ChatRole::kTool, result.content, {}, call.id, call.name});
  t.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + result.content, {}, "", ""});
  ORRERY_ASSIGN_OR_RETURN(env::EpisodeScore score, client.Score(ep.id, t));
  if (score.reward != 1.0) return InternalError("reward " + std::to_string(score.reward));
  ORRERY_ASSIGN_OR_RETURN(bool closed, client.Close(ep.id));
  if (!closed) return InternalError("close: the episode was not open");
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Fail("usage: env_serve_probe ENDPOINT (episodes N | survive)");
  const std::string endpoint = argv[1], mode = argv[2];
  zmq::context_t zmq;
  EnvClient client(zmq, "probe", {std::chrono::milliseconds(1000), std::chrono::milliseconds(500)});
  if (Status s = client.Connect(endpoint); !s.ok()) return Fail(s.ToString());
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  if (mode == "episodes" && argc == 4) {
    const int n = std::stoi(argv[3]);
    for (int i = 0; i < n; ++i) {
      if (Status s = RunEpisode(client, static_cast<uint64_t>(i)); !s.ok()) {
        return Fail("episode " + std::to_string(i) + ": " + s.ToString());
      }
    }
    std::printf("ok %d\n", n);
    return 0;
  }
  if (mode != "survive") return Fail("unknown mode '" + mode + "'");
  StatusOr<RemoteEpisode> ep = client.Reset("calc", env::Split::kTrain, 42);
  if (!ep.ok()) return Fail("reset: " + ep.status().ToString());
  std::printf("opened %s\n", ep->id.c_str());
  std::fflush(stdout);
  int failures = 0;
  while (true) {
    if (std::chrono::steady_clock::now() > end) return Fail("the episode was never lost");
    StatusOr<env::ToolResult> r =
        client.Step(ep->id, ToolCall{"c", "calculate", "{\"expression\": \"1+1\"}"});
    if (IsEpisodeLost(r.status())) break;
    if (!r.ok()) ++failures;  // the server is down: keep trying until it is back
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Re-issue: the same task on the new incarnation, to the end.
  while (true) {
    Status s = RunEpisode(client, 42);
    if (s.ok()) break;
    if (std::chrono::steady_clock::now() > end) return Fail("re-issue: " + s.ToString());
  }
  std::printf("recovered after %d failed calls\n", failures);
  return 0;
}
