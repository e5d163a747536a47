#include "env/sandbox/sandbox_pool.h"

#include <algorithm>

namespace orrery::env {

int ReadPoolSize(ConfigTable& table, const EnvDemand& demand, int max) {
  const int wanted = demand.episodes_in_flight > 0 ? demand.episodes_in_flight : 16;
  const int size = static_cast<int>(table.Int("pool_size", std::min(wanted, max), 1, max));
  if (size < demand.episodes_in_flight) {
    table.Fail("pool_size", "expected at least " + std::to_string(demand.episodes_in_flight) +
                                " (one sandbox per episode in flight: " + demand.source +
                                "), got " + std::to_string(size));
  }
  return size;
}

PooledSandbox::~PooledSandbox() {
  if (sandbox_) pool_->Release(std::move(sandbox_));
}

SandboxPool::SandboxPool(SandboxOptions options, int size, uint32_t first_slot)
    : options_(std::move(options)), size_(size), first_slot_(first_slot) {}

SandboxPool::~SandboxPool() = default;

StatusOr<std::unique_ptr<PooledSandbox>> SandboxPool::Acquire(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!idle_.empty()) {
      std::unique_ptr<Sandbox> s = std::move(idle_.back());
      idle_.pop_back();
      return std::make_unique<PooledSandbox>(this, std::move(s));
    }
    if (created_ < size_) {
      const uint32_t slot = first_slot_ + static_cast<uint32_t>(created_++);
      lock.unlock();
      StatusOr<std::unique_ptr<Sandbox>> s = Sandbox::Create(options_, slot);
      if (!s.ok()) {
        std::lock_guard<std::mutex> relock(mu_);
        --created_;
        return s.status();
      }
      return std::make_unique<PooledSandbox>(this, std::move(*s));
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty()) {
      return DeadlineExceededError("no free sandbox before the deadline (pool of " +
                                   std::to_string(size_) + ")");
    }
  }
}

void SandboxPool::Release(std::unique_ptr<Sandbox> sandbox) {
  // A sandbox whose work dir cannot be emptied is dropped (and a fresh one made on demand).
  const bool clean = sandbox->Reset().ok();
  sandbox->set_ro_binds(options_.ro_binds);
  std::lock_guard<std::mutex> lock(mu_);
  if (clean) {
    idle_.push_back(std::move(sandbox));
  } else {
    --created_;
  }
  cv_.notify_one();
}

}  // namespace orrery::env
