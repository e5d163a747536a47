#include "actors/envserver/server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "actors/envserver/codec.h"
#include "actors/runtime/fleet_curve.h"
#include "actors/runtime/payload.h"
#include "actors/schema/env.capnp.h"
#include "core/logging.h"
#include "core/message_limits.h"

namespace orrery::envserver {

// A request as received: the caller's identity, its envelope and body.
struct EnvServer::Request : WireMessage {};

namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  v ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

EnvServer::EnvServer(zmq::context_t& zmq, std::string name,
                     std::vector<std::unique_ptr<env::Env>> envs, const EnvServerOptions& options)
    : name_(std::move(name)),
      options_(options),
      incarnation_(NewIncarnation()),
      incarnation_hex_(Hex(incarnation_)),
      zmq_(zmq),
      socket_(zmq, zmq::socket_type::router),
      done_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      pool_(std::make_unique<ThreadPool>(options.workers)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::maxmsgsize, MaxMessageBytes());
  socket_.set(zmq::sockopt::router_mandatory, 0);  // replies to vanished callers are dropped
  for (auto& e : envs) {
    std::string n = e->name();
    envs_[n] = std::move(e);
  }
}

EnvServer::~EnvServer() {
  stopping_ = true;  // queued calls are answered Cancelled without running
  pool_.reset();     // joins the workers (running calls are bounded by their deadlines)
  if (done_fd_ >= 0) close(done_fd_);
}

std::vector<std::string> EnvServer::env_names() const {
  std::vector<std::string> names;
  for (const auto& [n, e] : envs_) names.push_back(n);
  return names;
}

Status EnvServer::Bind(const std::string& endpoint) {
  if (done_fd_ < 0) return ErrnoError("env server: eventfd", errno);
  try {
    SecureFleetSocket(zmq_, socket_, endpoint, SocketSide::kBind);
    socket_.bind(endpoint);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return UnavailableError("env server " + name_ + ": cannot bind " + endpoint + ": " + e.what());
  }
  return Status::OK();
}

env::Deadline EnvServer::CallDeadline(int64_t deadline_unix_ms) const {
  const env::Deadline cap = env::DeadlineIn(options_.max_call_s);
  if (deadline_unix_ms == 0) return cap;
  const env::Deadline d =
      env::Clock::now() + std::chrono::milliseconds(deadline_unix_ms - UnixMillis());
  return std::min(d, cap);
}

StatusOr<EnvServer::Slot*> EnvServer::FindEpisode(const std::string& id) {
  auto it = episodes_.find(id);
  if (it != episodes_.end()) return &it->second;
  const uint64_t inc = EpisodeIncarnation(id);
  if (inc != 0 && inc != incarnation_) {
    return NotFoundError("episode lost: " + id + " was opened by an earlier incarnation of " +
                         name_ + " (restarted); re-issue the task");
  }
  return NotFoundError("unknown episode '" + id + "' (closed, expired, or never opened)");
}

void EnvServer::Submit(Request& request, std::string episode_id, bool is_reset,
                       std::function<Status(Done&)> work) {
  auto shared = std::make_shared<Request>(std::move(request));
  pool_->Submit([this, shared, is_reset, work = std::move(work),
                 episode_id = std::move(episode_id)] {
    Done done;
    done.identity = shared->identity;
    done.envelope.method = shared->envelope.method;
    done.envelope.request_id = shared->envelope.request_id;
    done.envelope.sender = name_;
    done.envelope.is_reply = true;
    done.episode_id = episode_id;
    done.was_reset = is_reset;
    done.body = std::make_unique<capnp::MallocMessageBuilder>();
    const int64_t deadline = shared->envelope.deadline_unix_ms;
    if (stopping_) {
      done.envelope.status = CancelledError("env server is stopping");
    } else if (deadline != 0 && UnixMillis() > deadline) {
      done.envelope.status =
          DeadlineExceededError(done.envelope.method + ": deadline passed before it was served");
    } else {
      done.envelope.status = CatchAll(done.envelope.method, [&] { return work(done); });
    }
    Finish(std::move(done));
  });
}

void EnvServer::Finish(Done done) {
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_.push_back(std::move(done));
  }
  const uint64_t one = 1;
  ssize_t n = write(done_fd_, &one, sizeof(one));
  (void)n;  // an eventfd write fails only on counter overflow, which a reply count cannot reach
}

Status EnvServer::Describe(capnp::MallocMessageBuilder& reply) {
  auto r = reply.initRoot<schema::DescribeReply>();
  r.setIncarnation(incarnation_);
  auto list = r.initEnvs(static_cast<unsigned>(envs_.size()));
  unsigned i = 0;
  for (const auto& [n, e] : envs_) list[i++].setName(n);
  r.setOpenEpisodes(static_cast<uint32_t>(episodes_.size()));
  r.setServedBy(name_);
  return Status::OK();
}

Status EnvServer::StartTask(Request& request) {
  std::string env_name, split_name;
  uint64_t index = 0;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Task request", [&] {
    auto req = request.body.Root<schema::TaskRequest>();
    env_name = req.getEnv().cStr();
    split_name = req.getSplit().cStr();
    index = req.getIndex();
    return Status::OK();
  }));
  auto it = envs_.find(env_name);
  if (it == envs_.end()) return NotFoundError("unknown env '" + env_name + "'");
  ORRERY_ASSIGN_OR_RETURN(env::Split split, env::ParseSplit(split_name));
  env::Env* environment = it->second.get();
  // On a worker: an environment's Task is its own code (a plug-in may be slow or hostile).
  Submit(request, "", /*is_reset=*/false, [environment, split, index](Done& done) {
    ORRERY_ASSIGN_OR_RETURN(env::TaskRef task, environment->Task(split, index));
    auto r = done.body->initRoot<schema::TaskReply>();
    r.setTaskId(task.id);
    r.setTaskSeed(task.seed);
    return Status::OK();
  });
  return Status::OK();
}

Status EnvServer::StartReset(Request& request) {
  std::string env_name, split_name;
  uint64_t index = 0;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Reset request", [&] {
    auto req = request.body.Root<schema::ResetRequest>();
    env_name = req.getEnv().cStr();
    split_name = req.getSplit().cStr();
    index = req.getIndex();
    return Status::OK();
  }));
  auto it = envs_.find(env_name);
  if (it == envs_.end()) {
    std::string served;
    for (const auto& [n, e] : envs_) served += (served.empty() ? "" : ", ") + n;
    return NotFoundError("unknown env '" + env_name + "' (served here: " + served + ")");
  }
  ORRERY_ASSIGN_OR_RETURN(env::Split split, env::ParseSplit(split_name));
  if (static_cast<int>(episodes_.size()) + pending_resets_ >= options_.max_episodes) {
    return ResourceExhaustedError(name_ + " holds its maximum of " +
                                  std::to_string(options_.max_episodes) +
                                  " open episodes (close finished ones)");
  }
  const std::string id = incarnation_hex_ + "-" + std::to_string(next_episode_++);
  ++pending_resets_;
  env::Env* environment = it->second.get();
  const env::Deadline deadline = CallDeadline(request.envelope.deadline_unix_ms);
  Submit(request, id, /*is_reset=*/true, [environment, split, index, deadline, id](Done& done) {
    ORRERY_ASSIGN_OR_RETURN(env::TaskRef task, environment->Task(split, index));
    ORRERY_ASSIGN_OR_RETURN(done.new_episode, environment->Reset(task, deadline));
    const env::Episode& ep = *done.new_episode;
    auto r = done.body->initRoot<schema::ResetReply>();
    r.setEpisodeId(id);
    r.setTaskId(task.id);
    r.setTaskSeed(task.seed);
    MessagesToWire(ep.initial_messages(),
                   r.initMessages(static_cast<unsigned>(ep.initial_messages().size())));
    auto tools = r.initTools(static_cast<unsigned>(ep.tools().size()));
    for (size_t i = 0; i < ep.tools().size(); ++i) {
      ToWire(ep.tools()[i], tools[static_cast<unsigned>(i)]);
    }
    return Status::OK();
  });
  return Status::OK();
}

Status EnvServer::StartEpisodeCall(Request& request) {
  const bool is_step = request.envelope.method == "env.Step";
  std::string id;
  ToolCall call;
  std::vector<ChatMessage> trajectory;
  ORRERY_RETURN_IF_ERROR(CatchAll(request.envelope.method + " request", [&]() -> Status {
    if (is_step) {
      auto req = request.body.Root<schema::StepRequest>();
      id = req.getEpisodeId().cStr();
      call = FromWire(req.getCall());
    } else {
      auto req = request.body.Root<schema::ScoreRequest>();
      id = req.getEpisodeId().cStr();
      ORRERY_ASSIGN_OR_RETURN(trajectory, MessagesFromWire(req.getTrajectory()));
    }
    return Status::OK();
  }));
  ORRERY_ASSIGN_OR_RETURN(Slot * slot, FindEpisode(id));
  if (slot->busy) {
    return FailedPreconditionError("episode " + id +
                                   " is busy with another call (one call per episode at a time)");
  }
  slot->busy = true;
  env::Episode* episode = slot->episode.get();
  const env::Deadline deadline = CallDeadline(request.envelope.deadline_unix_ms);
  if (is_step) {
    Submit(request, id, false, [episode, call, deadline](Done& done) {
      ORRERY_ASSIGN_OR_RETURN(env::ToolResult result, episode->Step(call, deadline));
      auto r = done.body->initRoot<schema::StepReply>();
      r.setContent(result.content);
      r.setIsError(result.is_error);
      r.setLatencyS(result.latency_s);
      return Status::OK();
    });
  } else {
    Submit(request, id, false, [episode, trajectory, deadline](Done& done) {
      ORRERY_ASSIGN_OR_RETURN(env::EpisodeScore score, episode->Score(trajectory, deadline));
      auto r = done.body->initRoot<schema::ScoreReply>();
      r.setReward(score.reward);
      auto list = r.initComponents(static_cast<unsigned>(score.components.size()));
      unsigned i = 0;
      for (const auto& [n, v] : score.components) {
        list[i].setName(n);
        list[i].setValue(v);
        ++i;
      }
      return Status::OK();
    });
  }
  return Status::OK();
}

Status EnvServer::CloseEpisode(Request& request, capnp::MallocMessageBuilder& reply) {
  std::string id;
  ORRERY_RETURN_IF_ERROR(CatchAll("env.Close request", [&] {
    id = request.body.Root<schema::CloseRequest>().getEpisodeId().cStr();
    return Status::OK();
  }));
  auto r = reply.initRoot<schema::CloseReply>();
  auto it = episodes_.find(id);
  if (it == episodes_.end()) {
    r.setClosed(false);
  } else if (it->second.busy) {
    it->second.close_when_idle = true;  // the running call finishes first
    r.setClosed(true);
  } else {
    episodes_.erase(it);
    r.setClosed(true);
  }
  return Status::OK();
}

void EnvServer::ServeOne() {
  Request request;
  // On a malformed request the identity (and the envelope, when sound) are still read, so the
  // sender gets an error reply.
  Status read = ReceiveWireMessage(socket_, /*with_identity=*/true, &request);
  if (read.code() == StatusCode::kUnavailable) return;
  if (read.ok() && request.envelope.is_reply) {
    read = InvalidArgumentError("a reply sent to the env server");
  } else if (read.ok() && request.body.empty()) {
    read = InvalidArgumentError(request.envelope.method + ": request without a body");
  }
  Envelope reply_env;
  reply_env.method = request.envelope.method;
  reply_env.request_id = request.envelope.request_id;
  reply_env.sender = name_;
  reply_env.is_reply = true;
  capnp::MallocMessageBuilder reply;
  Status status = read;
  if (!read.ok()) {
    ORRERY_LOG(WARN) << "malformed request: " << read.message();
  } else {
    const std::string& m = request.envelope.method;
    const int64_t deadline = request.envelope.deadline_unix_ms;
    if (deadline != 0 && UnixMillis() > deadline) {
      status = DeadlineExceededError(m + ": deadline passed before it was served");
    } else if (m == "env.Describe") {
      status = Describe(reply);
    } else if (m == "env.Close") {
      status = CloseEpisode(request, reply);
    } else if (m == "env.Task") {
      status = StartTask(request);
      if (status.ok()) return;  // the worker replies
    } else if (m == "env.Reset") {
      status = StartReset(request);
      if (status.ok()) return;  // the worker replies
    } else if (m == "env.Step" || m == "env.Score") {
      status = StartEpisodeCall(request);
      if (status.ok()) return;  // the worker replies
    } else {
      status = UnimplementedError(
          name_ + " has no method '" + m +
          "' (env.Describe, env.Task, env.Reset, env.Step, env.Score, env.Close)");
    }
  }
  reply_env.status = status;
  Status sent =
      SendWireMessage(socket_, &request.identity, reply_env, status.ok() ? &reply : nullptr);
  if (!sent.ok())
    ORRERY_LOG(WARN) << "reply to " << request.envelope.sender << ": " << sent.message();
}

void EnvServer::DrainDone() {
  uint64_t counter;
  ssize_t n = read(done_fd_, &counter, sizeof(counter));
  (void)n;  // EAGAIN when a previous drain already took everything
  std::deque<Done> batch;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    batch.swap(done_);
  }
  const auto now = std::chrono::steady_clock::now();
  for (Done& d : batch) {
    if (d.was_reset) {
      --pending_resets_;
      if (d.envelope.status.ok()) {
        Slot slot;
        slot.episode = std::move(d.new_episode);
        slot.last_used = now;
        episodes_.emplace(d.episode_id, std::move(slot));
      }
    } else if (auto it = episodes_.find(d.episode_id); it != episodes_.end()) {
      it->second.busy = false;
      it->second.last_used = now;
      if (it->second.close_when_idle) episodes_.erase(it);
    }
    Status sent = SendWireMessage(socket_, &d.identity, d.envelope,
                                  d.envelope.status.ok() ? d.body.get() : nullptr);
    if (!sent.ok()) ORRERY_LOG(WARN) << "reply " << d.envelope.method << ": " << sent.message();
  }
}

void EnvServer::ExpireIdle() {
  const auto now = std::chrono::steady_clock::now();
  const auto idle = std::chrono::duration<double>(options_.idle_timeout_s);
  for (auto it = episodes_.begin(); it != episodes_.end();) {
    if (!it->second.busy && now - it->second.last_used > idle) {
      ORRERY_LOG(INFO) << "closing idle episode " << it->first;
      it = episodes_.erase(it);
    } else {
      ++it;
    }
  }
}

Status EnvServer::Run(const Cancellation& stop, const std::function<void()>& on_iteration) {
  if (endpoint_.empty())
    return FailedPreconditionError("env server " + name_ + ": Run before Bind");
  auto next_expiry = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (!stop.cancelled()) {
    if (on_iteration) on_iteration();
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, stop.fd(), ZMQ_POLLIN, 0},
                               {nullptr, done_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 3, std::chrono::milliseconds(200));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return UnavailableError("env server " + name_ + ": poll failed: " + e.what());
    }
    if (items[2].revents & ZMQ_POLLIN) DrainDone();
    if (items[0].revents & ZMQ_POLLIN) {
      for (int i = 0; i < 64 && !stop.cancelled(); ++i) {
        if (!(socket_.get(zmq::sockopt::events) & ZMQ_POLLIN)) break;
        ServeOne();
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_expiry) {
      ExpireIdle();
      next_expiry = now + std::chrono::milliseconds(200);
    }
  }
  stopping_ = true;
  return Status::OK();
}

}  // namespace orrery::envserver
