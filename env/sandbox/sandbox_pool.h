// A pool of sandboxes reused across episodes.
//
// Creating a sandbox makes a private work dir (chowned to its own host uid) and compiles the
// seccomp filter; the pool does that once per slot and, when an episode gives its sandbox back,
// empties the work dir so the next episode starts clean. Acquire() blocks until a sandbox is free
// or the deadline passes. Thread-safe.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "core/config.h"
#include "env/env.h"
#include "env/sandbox/sandbox.h"

namespace orrery::env {

// The `pool_size` key of an environment's options, in [1, max]: by default the demand's episodes
// in flight (16 when unknown); a value below them is recorded as the table's error.
int ReadPoolSize(ConfigTable& table, const EnvDemand& demand, int max);

class SandboxPool;

// A sandbox on loan; returns to its pool when destroyed.
class PooledSandbox {
 public:
  PooledSandbox(SandboxPool* pool, std::unique_ptr<Sandbox> sandbox)
      : pool_(pool), sandbox_(std::move(sandbox)) {}
  ~PooledSandbox();
  PooledSandbox(const PooledSandbox&) = delete;
  PooledSandbox& operator=(const PooledSandbox&) = delete;
  Sandbox* operator->() const { return sandbox_.get(); }
  Sandbox& operator*() const { return *sandbox_; }

 private:
  SandboxPool* pool_;
  std::unique_ptr<Sandbox> sandbox_;
};

class SandboxPool {
 public:
  // `size` sandboxes at most; they are created lazily, on first demand. `first_slot` offsets the
  // host uids so that several pools in one process do not share uids.
  SandboxPool(SandboxOptions options, int size, uint32_t first_slot = 0);
  ~SandboxPool();
  StatusOr<std::unique_ptr<PooledSandbox>> Acquire(Deadline deadline);
  const SandboxOptions& options() const { return options_; }

 private:
  friend class PooledSandbox;
  void Release(std::unique_ptr<Sandbox> sandbox);

  const SandboxOptions options_;
  const int size_;
  const uint32_t first_slot_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sandbox>> idle_;
  int created_ = 0;
};

}  // namespace orrery::env
