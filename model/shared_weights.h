// Shared weights: a policy version handed from the learner to rollouts on the same host through
// a shared buffer (core/shared_buffer.h: CUDA IPC on the GPU, a memfd on the CPU) instead of a
// file — [rl.rollout] weights = "shared" (docs/rl.md). The weight files stay: they serve rollouts
// on other hosts, restarts, and this path's fallback.
//
//   learner:  publisher = SharedWeightPublisher::Create(named, device);
//             publisher->Publish(named, version, now);      // after each update
//             publisher->Acquire(newer_than) / Release(lease)   // answered for readers
//   rollout:  grant = <ask the learner: Acquire>;             // over the fleet's channel
//             reader.CopyInto(grant.handle, layout, targets);  // between decode steps
//             intact = <ask the learner: Release(grant.lease)>;
//
// Layout: every tensor of a version (by checkpoint name: parameters' f32 masters and balancing
// biases) at a 256-byte aligned offset of one buffer; the reader checks names, dtypes and shapes
// against its own tensors before the first byte is copied.
//
// Handshake (two buffers, versions, leases): versions alternate between two buffers. A reader is
// granted a lease on the buffer holding the newest version only; the publisher writes the next
// version into the other buffer, and before it rewrites a buffer it waits until that buffer's
// leases are released or expired (lease_ttl: a reader that died stalls the learner no longer).
// Release answers whether the lease was still live: a reader whose lease expired while it copied
// (stalled past the TTL, so the buffer may have been rewritten under it) learns that its copy may
// be torn and must not use it. So a reader never uses bytes that were being rewritten, and the
// learner never waits more than lease_ttl for a reader.
// Copies are ordered after the writer's queued work and synchronised before the version is
// announced (publisher) or the lease released (reader).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/shared_buffer.h"
#include "core/status.h"
#include "core/tensor.h"

namespace orrery::model {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SharedWeightEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t offset = 0;  // bytes into the buffer, a multiple of kSharedWeightAlignment
  int64_t bytes = 0;
};

inline constexpr int64_t kSharedWeightAlignment = 256;

class SharedWeightLayout {
 public:
  SharedWeightLayout() = default;
  // The layout of `named`, in its order. Names must be unique and free of whitespace.
  static StatusOr<SharedWeightLayout> Of(const NamedTensors& named);
  // One line per entry: "NAME DTYPE DIM,DIM,... OFFSET".
  std::string Serialize() const;
  static StatusOr<SharedWeightLayout> Parse(const std::string& text);

  const std::vector<SharedWeightEntry>& entries() const { return entries_; }
  int64_t total_bytes() const { return total_bytes_; }
  // OK when `tensors` are exactly the entries (every name once, the same dtype and shape); else
  // one line naming the first difference.
  Status Matches(const NamedTensors& tensors) const;

 private:
  std::vector<SharedWeightEntry> entries_;
  int64_t total_bytes_ = 0;
};

struct SharedWeightGrant {
  int64_t version = -1;  // -1: nothing newer than asked for is shared
  uint64_t lease = 0;
  std::string handle;       // the buffer (SharedBufferMapping::Open)
  double published_at = 0;  // the publisher's clock (Unix seconds) when the version's copy began
};

class SharedWeightPublisher {
 public:
  struct Options {
    std::chrono::milliseconds lease_ttl{10000};
  };
  // Two buffers for tensors shaped like `like`, on `device`.
  static StatusOr<std::unique_ptr<SharedWeightPublisher>> Create(const NamedTensors& like,
                                                                 Device device, Options options);
  static StatusOr<std::unique_ptr<SharedWeightPublisher>> Create(const NamedTensors& like,
                                                                 Device device) {
    return Create(like, device, Options());
  }

  // Copies `named` (the layout of Create) into the buffer that does not hold the newest version,
  // once no live lease holds it, and makes `version` the newest. Returns the seconds spent copying
  // (and synchronising), without the wait for leases. `published_at` is reported to readers.
  StatusOr<double> Publish(const NamedTensors& named, int64_t version, double published_at);

  // A reader's request: the newest version when it is newer than `newer_than`, leased to the
  // reader until Release or the TTL. Thread-safe against Publish.
  SharedWeightGrant Acquire(int64_t newer_than);
  // Ends a lease; true when it was still live, so its buffer was not rewritten since the grant
  // (the reader's copy is whole). Expired or unknown leases (released twice, never granted) give
  // false.
  bool Release(uint64_t lease);

  const SharedWeightLayout& layout() const { return layout_; }
  Device device() const { return device_; }
  int64_t newest_version() const;
  // Leases granted and not yet released or expired (for tests and metrics).
  int live_leases() const;

 private:
  struct Slot {
    std::unique_ptr<SharedBuffer> buffer;
    int64_t version = -1;  // -1: empty or being written
    double published_at = 0;
  };
  struct Lease {
    int slot = 0;
    std::chrono::steady_clock::time_point expires;
  };
  SharedWeightPublisher() = default;
  void DropExpiredLocked(std::chrono::steady_clock::time_point now);

  SharedWeightLayout layout_;
  Device device_;
  Options options_;
  mutable std::mutex mu_;
  std::condition_variable released_;
  Slot slots_[2];
  int newest_ = -1;  // the slot holding the newest version
  uint64_t next_lease_ = 1;
  std::map<uint64_t, Lease> leases_;
};

// The reader's side: maps the buffers it is handed (kept for the next versions: a publisher has
// two) and copies a version into its own tensors.
class SharedWeightReader {
 public:
  // Maps the buffer `handle` names (kept for the next calls); an error means nothing was mapped.
  Status Map(const std::string& handle);
  // Copies the buffer `handle` names (mapped first if need be), laid out as `layout`, into
  // `targets` (matched by name; exactly the layout's tensors) and waits for the copies. Returns
  // the seconds.
  StatusOr<double> CopyInto(const std::string& handle, const SharedWeightLayout& layout,
                            const NamedTensors& targets);
  // Forgets every mapping (e.g. after the publisher restarted: its old buffers are gone).
  void Reset() { mappings_.clear(); }

 private:
  StatusOr<const SharedBufferMapping*> Mapping(const std::string& handle);
  std::vector<std::unique_ptr<SharedBufferMapping>> mappings_;  // newest last, at most 4
};

}  // namespace orrery::model
