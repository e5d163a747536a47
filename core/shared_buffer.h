// SharedBuffer: bytes that another process on the same host can map without a copy through a
// file — the learner's published weights, read by rollouts on its host (model/shared_weights.h).
//
//   exporter:  auto buf = SharedBuffer::Create(Device::Cuda(0), bytes);   // write buf->data()
//              send buf->handle() to the reader (any channel: it is a short string)
//   importer:  auto view = SharedBufferMapping::Open(handle);            // read view->data()
//
// Where the bytes live follows the device:
//   - CUDA: a cudaMalloc allocation exported with CUDA IPC (core/cuda_ipc.h); the importer maps
//     the same device memory and copies device to device.
//   - CPU: an anonymous memfd mapped shared; the importer opens it through /proc/<pid>/fd/<fd>
//     (same host, same PID namespace, a user allowed to read the exporter's descriptors) and maps
//     it read-only. The memfd's name carries a random nonce the importer checks, so a recycled pid
//     or descriptor number is refused rather than read.
// The memory lives as long as the exporter's SharedBuffer (and, for a memfd, the importers'
// mappings). Neither side synchronises access: the protocol above it does (shared_weights.h:
// leases and versions).
//
// Handle text: "cpu/<pid>/<fd>/<bytes>/<nonce>" or "cuda/<device>/<bytes>/<128 hex digits>".
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/status.h"

namespace orrery {

class SharedBuffer {
 public:
  // Fails with one line: no CUDA in the build or no such device, out of memory, memfd errors.
  static StatusOr<std::unique_ptr<SharedBuffer>> Create(Device device, size_t bytes);
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  const std::string& handle() const { return handle_; }

 private:
  SharedBuffer() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  int fd_ = -1;  // CPU: the memfd
  std::string handle_;
};

class SharedBufferMapping {
 public:
  // Maps the buffer a handle names. Errors name the handle's kind and why (malformed handle,
  // another host's or a dead process's buffer, a nonce that does not match, CUDA IPC refused).
  static StatusOr<std::unique_ptr<SharedBufferMapping>> Open(const std::string& handle);
  ~SharedBufferMapping();
  SharedBufferMapping(const SharedBufferMapping&) = delete;
  SharedBufferMapping& operator=(const SharedBufferMapping&) = delete;

  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  const std::string& handle() const { return handle_; }

 private:
  SharedBufferMapping() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  std::string handle_;
};

}  // namespace orrery
