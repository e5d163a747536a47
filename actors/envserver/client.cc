#include "actors/envserver/client.h"

#include "actors/envserver/codec.h"
#include "actors/schema/env.capnp.h"

namespace orrery::envserver {

namespace {
constexpr char kLostPrefix[] = "episode lost: ";
}

bool IsEpisodeLost(const Status& status) {
  return status.code() == StatusCode::kNotFound && status.message().rfind(kLostPrefix, 0) == 0;
}

EnvClient::EnvClient(zmq::context_t& zmq, std::string self_name, EnvClientOptions options)
    : zmq_(zmq), name_(std::move(self_name)), options_(options), client_(zmq_, name_) {}

Status EnvClient::Connect(const std::string& endpoint) {
  endpoint_ = endpoint;
  return client_.Connect(endpoint);
}

Status EnvClient::AfterFailure(const Status& status, const std::string& episode_id) {
  const StatusCode code = status.code();
  if (code != StatusCode::kDeadlineExceeded && code != StatusCode::kUnavailable) return status;
  // The server may have died with our request: a fresh socket drops what was queued for the old
  // connection, and the next call reaches whatever now listens at the endpoint.
  ORRERY_RETURN_IF_ERROR(client_.Connect(endpoint_));
  const uint64_t opened_by = EpisodeIncarnation(episode_id);
  if (opened_by == 0) return status;
  auto probe = client_.Call<schema::DescribeRequest, schema::DescribeReply>(
      "env.Describe", [](schema::DescribeRequest::Builder) {},
      CallOptions{options_.probe_timeout, options_.cancel});
  if (!probe.ok()) {
    ORRERY_RETURN_IF_ERROR(client_.Connect(endpoint_));
    return UnavailableError("env server " + endpoint_ + " did not answer (" + status.message() +
                            "; probe: " + probe.status().message() + ")");
  }
  if (probe->get().getIncarnation() != opened_by) {
    return NotFoundError(std::string(kLostPrefix) + episode_id + " was opened by an earlier " +
                         "incarnation of the env server at " + endpoint_ +
                         " (restarted); re-issue the task");
  }
  return status;
}

StatusOr<EnvServerInfo> EnvClient::Describe() {
  auto reply = client_.Call<schema::DescribeRequest, schema::DescribeReply>(
      "env.Describe", [](schema::DescribeRequest::Builder) {}, Call());
  if (!reply.ok()) return AfterFailure(reply.status(), "");
  EnvServerInfo info;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Describe reply", [&] {
    auto r = reply->get();
    info.incarnation = r.getIncarnation();
    for (auto e : r.getEnvs()) info.envs.push_back(e.getName().cStr());
    info.open_episodes = r.getOpenEpisodes();
    info.served_by = r.getServedBy().cStr();
    return Status::OK();
  }));
  return info;
}

StatusOr<env::TaskRef> EnvClient::Task(const std::string& env, env::Split split, uint64_t index) {
  auto reply = client_.Call<schema::TaskRequest, schema::TaskReply>(
      "env.Task",
      [&](schema::TaskRequest::Builder req) {
        req.setEnv(env);
        req.setSplit(std::string(env::SplitName(split)));
        req.setIndex(index);
      },
      Call());
  if (!reply.ok()) return AfterFailure(reply.status(), "");
  env::TaskRef task;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Task reply", [&] {
    auto r = reply->get();
    task.id = r.getTaskId().cStr();
    task.split = split;
    task.seed = r.getTaskSeed();
    task.index = index;
    return Status::OK();
  }));
  return task;
}

StatusOr<RemoteEpisode> EnvClient::Reset(const std::string& env, env::Split split, uint64_t index) {
  auto reply = client_.Call<schema::ResetRequest, schema::ResetReply>(
      "env.Reset",
      [&](schema::ResetRequest::Builder req) {
        req.setEnv(env);
        req.setSplit(std::string(env::SplitName(split)));
        req.setIndex(index);
      },
      Call());
  if (!reply.ok()) return AfterFailure(reply.status(), "");
  RemoteEpisode ep;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Reset reply", [&]() -> Status {
    auto r = reply->get();
    ep.id = r.getEpisodeId().cStr();
    ep.task.id = r.getTaskId().cStr();
    ep.task.split = split;
    ep.task.seed = r.getTaskSeed();
    ep.task.index = index;
    ORRERY_ASSIGN_OR_RETURN(ep.messages, MessagesFromWire(r.getMessages()));
    for (auto t : r.getTools()) ep.tools.push_back(FromWire(t));
    return Status::OK();
  }));
  return ep;
}

StatusOr<env::ToolResult> EnvClient::Step(const std::string& episode_id, const ToolCall& call) {
  auto reply = client_.Call<schema::StepRequest, schema::StepReply>(
      "env.Step",
      [&](schema::StepRequest::Builder req) {
        req.setEpisodeId(episode_id);
        ToWire(call, req.initCall());
      },
      Call());
  if (!reply.ok()) return AfterFailure(reply.status(), episode_id);
  env::ToolResult result;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Step reply", [&] {
    auto r = reply->get();
    result.content = r.getContent().cStr();
    result.is_error = r.getIsError();
    result.latency_s = r.getLatencyS();
    return Status::OK();
  }));
  return result;
}

StatusOr<env::EpisodeScore> EnvClient::Score(const std::string& episode_id,
                                             const std::vector<ChatMessage>& trajectory) {
  auto reply = client_.Call<schema::ScoreRequest, schema::ScoreReply>(
      "env.Score",
      [&](schema::ScoreRequest::Builder req) {
        req.setEpisodeId(episode_id);
        MessagesToWire(trajectory, req.initTrajectory(static_cast<unsigned>(trajectory.size())));
      },
      Call());
  if (!reply.ok()) return AfterFailure(reply.status(), episode_id);
  env::EpisodeScore score;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Score reply", [&] {
    auto r = reply->get();
    score.reward = r.getReward();
    for (auto c : r.getComponents()) score.components[c.getName().cStr()] = c.getValue();
    return Status::OK();
  }));
  return score;
}

StatusOr<bool> EnvClient::Close(const std::string& episode_id) {
  auto reply = client_.Call<schema::CloseRequest, schema::CloseReply>(
      "env.Close", [&](schema::CloseRequest::Builder req) { req.setEpisodeId(episode_id); },
      Call());
  if (!reply.ok()) return AfterFailure(reply.status(), episode_id);
  bool closed = false;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Close reply", [&] {
    closed = reply->get().getClosed();
    return Status::OK();
  }));
  return closed;
}

}  // namespace orrery::envserver
