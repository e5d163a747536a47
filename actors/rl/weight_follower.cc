#include "actors/rl/weight_follower.h"

#include <utility>

#include "core/logging.h"
#include "learner/rl/weight_store.h"

namespace orrery::rl_actors {

WeightFollower::WeightFollower(zmq::context_t& zmq, std::string self_name,
                               WeightFetchOptions options, std::string endpoint,
                               std::chrono::milliseconds poll)
    : zmq_(zmq),
      self_name_(std::move(self_name)),
      options_(std::move(options)),
      endpoint_(std::move(endpoint)),
      poll_(poll) {}

WeightFollower::~WeightFollower() {
  stop_.Cancel();
  if (thread_.joinable()) thread_.join();
}

Status WeightFollower::Start() {
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

Status WeightFollower::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

std::vector<FetchStats> WeightFollower::TakeFetched() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(fetched_, {});
}

void WeightFollower::Loop() {
  // The socket lives on this thread (a client is used from one thread at a time).
  WeightFetcher fetcher(zmq_, self_name_, options_);
  Status connected = fetcher.Connect(endpoint_);
  if (!connected.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = connected;
    return;
  }
  auto last_warning = std::chrono::steady_clock::now() - std::chrono::minutes(2);
  do {
    StatusOr<int64_t> local = rl::WeightStore(options_.dir, options_.keep).Latest();
    StatusOr<FetchStats> got = fetcher.FetchNewest(local.ok() ? *local : -1, &stop_);
    rounds_.fetch_add(1, std::memory_order_acq_rel);
    if (got.ok()) {
      if (got->version >= 0) {
        ORRERY_LOG(INFO) << "weights: version " << got->version << " from " << endpoint_ << " ("
                         << got->bytes_fetched << " bytes in " << got->seconds << " s"
                         << (got->resumed_at > 0 ? ", resumed" : "") << ")";
        std::lock_guard<std::mutex> lock(mu_);
        // Bounded for a caller that stops taking them: the oldest report is dropped.
        if (fetched_.size() >= 64) fetched_.erase(fetched_.begin());
        fetched_.push_back(*got);
      }
      continue;
    }
    const StatusCode code = got.status().code();
    if (code == StatusCode::kCancelled) break;
    if (code == StatusCode::kDeadlineExceeded || code == StatusCode::kUnavailable ||
        code == StatusCode::kNotFound) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last_warning >= std::chrono::minutes(1)) {
        ORRERY_LOG(WARN) << got.status().message() << " (trying again every " << poll_.count()
                         << " ms)";
        last_warning = now;
      }
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    status_ = got.status();
    return;
  } while (!stop_.WaitFor(poll_));
}

}  // namespace orrery::rl_actors
