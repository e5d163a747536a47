#include "actors/envserver/remote_env.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "actors/envserver/client.h"
#include "core/thread_pool.h"

namespace orrery::envserver {
namespace {

// Deadline of a Close sent for an episode dropped unscored: a courtesy (the server expires idle
// episodes anyway), so a dead server costs the closer little.
constexpr std::chrono::milliseconds kCloseTimeout{200};

std::chrono::milliseconds Until(env::Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - env::Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// env/env.h's meaning: a lost episode is the environment's worker gone, not a failed tool.
Status AsEnvStatus(const Status& s) {
  if (IsEpisodeLost(s)) return UnavailableError(s.message());
  return s;
}

// The EnvClients of one server, lent to one caller at a time.
class ClientPool {
 public:
  ClientPool(zmq::context_t& zmq, std::string self_name, std::string endpoint)
      : zmq_(zmq), name_(std::move(self_name)), endpoint_(std::move(endpoint)) {}

  class Lease {
   public:
    Lease(ClientPool* pool, std::unique_ptr<EnvClient> client)
        : pool_(pool), client_(std::move(client)) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (client_ != nullptr) pool_->Return(std::move(client_));
    }
    EnvClient* operator->() { return client_.get(); }

   private:
    ClientPool* pool_;
    std::unique_ptr<EnvClient> client_;
  };

  StatusOr<Lease> Borrow(std::chrono::milliseconds timeout) {
    std::unique_ptr<EnvClient> client;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        client = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (client == nullptr) {
      EnvClientOptions o;
      o.probe_timeout = std::chrono::milliseconds(500);
      client = std::make_unique<EnvClient>(zmq_, name_, o);
      ORRERY_RETURN_IF_ERROR(client->Connect(endpoint_));
    }
    client->set_timeout(timeout);
    return Lease(this, std::move(client));
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  void Return(std::unique_ptr<EnvClient> client) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(client));
  }

  zmq::context_t& zmq_;
  std::string name_, endpoint_;
  std::mutex mu_;
  std::vector<std::unique_ptr<EnvClient>> free_;
};

class RemoteEnv;

class RemoteEpisode final : public env::Episode {
 public:
  RemoteEpisode(RemoteEnv* env, ClientPool* server, envserver::RemoteEpisode opened)
      : env_(env), server_(server), opened_(std::move(opened)) {}
  ~RemoteEpisode() override;

  const std::vector<ChatMessage>& initial_messages() const override { return opened_.messages; }
  const std::vector<env::ToolSpec>& tools() const override { return opened_.tools; }

  StatusOr<env::ToolResult> Step(const ToolCall& call, env::Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(ClientPool::Lease client, server_->Borrow(Until(deadline)));
    StatusOr<env::ToolResult> r = client->Step(opened_.id, call);
    if (!r.ok()) return AsEnvStatus(r.status());
    return r;
  }

  StatusOr<env::EpisodeScore> Score(const std::vector<ChatMessage>& trajectory,
                                    env::Deadline deadline) override {
    ORRERY_ASSIGN_OR_RETURN(ClientPool::Lease client, server_->Borrow(Until(deadline)));
    StatusOr<env::EpisodeScore> r = client->Score(opened_.id, trajectory);
    if (!r.ok()) return AsEnvStatus(r.status());
    // Scored: nothing more to ask of it.
    client->set_timeout(kCloseTimeout);
    closed_ = client->Close(opened_.id).ok();
    return r;
  }

 private:
  RemoteEnv* env_;
  ClientPool* server_;
  envserver::RemoteEpisode opened_;
  bool closed_ = false;
};

class RemoteEnv final : public env::Env {
 public:
  RemoteEnv(zmq::context_t& zmq, const std::string& self_name, const RemoteEnvOptions& options)
      : env_name_(options.env), closer_(std::make_unique<ThreadPool>(1)) {
    for (const std::string& e : options.endpoints) {
      servers_.push_back(std::make_unique<ClientPool>(zmq, self_name, e));
    }
  }
  ~RemoteEnv() override {
    stopping_ = true;  // closes still queued are skipped: the servers expire those episodes
    closer_.reset();
  }

  std::string name() const override { return env_name_; }

  StatusOr<env::TaskRef> Task(env::Split split, uint64_t index) const override {
    // Every server of one run has the same [env] configuration: the first one names tasks.
    ORRERY_ASSIGN_OR_RETURN(ClientPool::Lease client,
                            servers_[0]->Borrow(std::chrono::milliseconds(30000)));
    StatusOr<env::TaskRef> task = client->Task(env_name_, split, index);
    if (!task.ok()) return task.status().WithContext("env server " + servers_[0]->endpoint());
    return task;
  }

  StatusOr<std::unique_ptr<env::Episode>> Reset(const env::TaskRef& task,
                                                env::Deadline deadline) override {
    ClientPool* server = servers_[next_server_++ % servers_.size()].get();
    ORRERY_ASSIGN_OR_RETURN(ClientPool::Lease client, server->Borrow(Until(deadline)));
    StatusOr<envserver::RemoteEpisode> opened = client->Reset(env_name_, task.split, task.index);
    if (!opened.ok()) return AsEnvStatus(opened.status());
    return std::unique_ptr<env::Episode>(
        std::make_unique<RemoteEpisode>(this, server, std::move(*opened)));
  }

  // Closes an episode dropped unscored, off the caller's thread.
  void CloseLater(ClientPool* server, std::string id) {
    closer_->Submit([this, server, id = std::move(id)] {
      if (stopping_) return;
      StatusOr<ClientPool::Lease> client = server->Borrow(kCloseTimeout);
      if (client.ok()) (void)(*client)->Close(id);
    });
  }

 private:
  std::string env_name_;
  std::vector<std::unique_ptr<ClientPool>> servers_;
  std::atomic<uint64_t> next_server_{0};
  std::atomic<bool> stopping_{false};
  std::unique_ptr<ThreadPool> closer_;  // reset first in the destructor
};

RemoteEpisode::~RemoteEpisode() {
  if (!closed_) env_->CloseLater(server_, opened_.id);
}

}  // namespace

StatusOr<std::unique_ptr<env::Env>> CreateRemoteEnv(zmq::context_t& zmq,
                                                    const std::string& self_name,
                                                    const RemoteEnvOptions& options) {
  if (options.env.empty()) return InvalidArgumentError("remote env: no environment name");
  if (options.endpoints.empty()) {
    return InvalidArgumentError("remote env '" + options.env + "': no env server endpoints");
  }
  return std::unique_ptr<env::Env>(std::make_unique<RemoteEnv>(zmq, self_name, options));
}

}  // namespace orrery::envserver
