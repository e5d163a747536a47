// WeightFollower: keeps a rollout's local weight directory at the newest version learner rank 0
// serves ([rl.rollout] weights = "learner"). A thread of its own runs WeightFetcher every poll
// interval, so decoding goes on with the current version while the next one arrives; the rollout
// then loads it from the directory exactly as it would from a shared RUN/rl/weights.
//
//   WeightFollower follower(zmq, "rollout:2", fetch_options, learner_endpoint, poll);
//   follower.Start();
//   ... ORRERY_RETURN_IF_ERROR(follower.status());   // in the rollout's loop
//
// The learner being unreachable, restarting or pruning a version is not an error (the next poll
// tries again, logged at most once a minute); a local disk error or data damaged past the
// fetcher's retries is, and status() returns it from then on (the rollout exits with it and its
// supervisor restarts it; the part file is resumed).
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "actors/rl/weight_fetcher.h"
#include "actors/runtime/cancellation.h"
#include "core/status.h"

namespace orrery::rl_actors {

class WeightFollower {
 public:
  WeightFollower(zmq::context_t& zmq, std::string self_name, WeightFetchOptions options,
                 std::string endpoint, std::chrono::milliseconds poll);
  ~WeightFollower();  // stops and joins the thread (an unfinished fetch resumes next time)
  WeightFollower(const WeightFollower&) = delete;
  WeightFollower& operator=(const WeightFollower&) = delete;

  Status Start();
  // OK, or the error that stopped the thread.
  Status status() const;
  // The fetches that brought a version since the previous call, oldest first: each is handed out
  // once, so the rollout reports every fetch even when it loads a newer version than the one a
  // fetch brought, or polls between a version's file appearing and its fetch being recorded.
  std::vector<FetchStats> TakeFetched();
  // Fetch rounds completed (whatever their outcome): a rollout starting up waits for the first,
  // so that it begins on the learner's version rather than on its initial policy.
  int64_t rounds() const { return rounds_.load(std::memory_order_acquire); }

 private:
  void Loop();

  zmq::context_t& zmq_;
  std::string self_name_;
  WeightFetchOptions options_;
  std::string endpoint_;
  std::chrono::milliseconds poll_;
  Cancellation stop_;
  std::thread thread_;
  mutable std::mutex mu_;
  Status status_;
  std::vector<FetchStats> fetched_;  // not yet taken
  std::atomic<int64_t> rounds_{0};
};

}  // namespace orrery::rl_actors
