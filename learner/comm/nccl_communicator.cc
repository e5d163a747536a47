#include "learner/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/logging.h"
#include "learner/comm/rendezvous_file.h"

namespace orrery::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string Where(int rank) { return "nccl rank " + std::to_string(rank) + ": "; }

Status CudaCheck(cudaError_t e, int rank, const char* call) {
  if (e == cudaSuccess) return Status::OK();
  return UnavailableError(Where(rank) + call + " failed: " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ")");
}

Status NcclError(ncclResult_t r, ncclComm_t comm, int rank, const std::string& call) {
  std::string detail = ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') {
    detail += ": ";
    detail += last;
  }
  return UnavailableError(Where(rank) + call + " failed: " + detail);
}

// Sleeps between polls: short at first (collectives of a healthy group finish in microseconds to
// milliseconds), then up to 1 ms so a long wait does not burn a core.
class Backoff {
 public:
  void Pause() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds pause_{5};
};

// In non-blocking mode an NCCL call may return ncclInProgress; the communicator's state then
// says when it is done. Waits for that (or an error, or the deadline).
Status AwaitNccl(ncclComm_t comm, ncclResult_t first, Clock::time_point deadline, int rank,
                 const std::string& call, std::chrono::milliseconds timeout) {
  ncclResult_t state = first;
  Backoff backoff;
  while (state == ncclInProgress) {
    if (Clock::now() >= deadline) {
      return DeadlineExceededError(Where(rank) + call + " did not complete within " +
                                   std::to_string(timeout.count()) + " ms");
    }
    backoff.Pause();
    if (ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) {
      return NcclError(r, comm, rank, "ncclCommGetAsyncError during " + call);
    }
  }
  if (state != ncclSuccess) return NcclError(state, comm, rank, call);
  return Status::OK();
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int rank, int world_size, int device, std::chrono::milliseconds timeout)
      : rank_(rank), world_size_(world_size), device_(device), timeout_(timeout) {}

  ~NcclCommunicator() override {
    Warn(cudaSetDevice(device_), "cudaSetDevice");
    if (comm_ != nullptr && broken_.ok()) {
      // Flushes outstanding work (none: every collective waited for its stream) and closes the
      // connections, bounded by the timeout; when that fails the communicator is aborted below.
      const Status s = AwaitNccl(comm_, ncclCommFinalize(comm_), Clock::now() + timeout_, rank_,
                                 "ncclCommFinalize", timeout_);
      if (s.ok()) {
        if (ncclResult_t r = ncclCommDestroy(comm_); r != ncclSuccess) {
          ORRERY_LOG(WARN) << NcclError(r, comm_, rank_, "ncclCommDestroy").message();
        }
        comm_ = nullptr;
      } else {
        ORRERY_LOG(WARN) << s.message();
      }
    }
    Abort();
    if (stream_ == nullptr) return;
    // Freeing device memory synchronizes with the device, so it waits for an idle stream (an
    // aborted collective winds down once NCCL's abort flag is set). A stream still busy after the
    // timeout keeps its buffers: the process is exiting, and the driver reclaims them then.
    const auto deadline = Clock::now() + timeout_;
    Backoff backoff;
    while (cudaStreamQuery(stream_) == cudaErrorNotReady && Clock::now() < deadline) {
      backoff.Pause();
    }
    if (cudaStreamQuery(stream_) != cudaSuccess) {
      ORRERY_LOG(WARN) << Where(rank_) << "stream not idle at shutdown; its buffers are not freed";
      return;
    }
    if (device_buffer_ != nullptr) Warn(cudaFree(device_buffer_), "cudaFree");
    if (staging_ != nullptr) Warn(cudaFreeHost(staging_), "cudaFreeHost");
    Warn(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }

  // Creates the stream and joins the group with the unique id shared by rank 0.
  Status Init(const ncclUniqueId& id, Clock::time_point deadline) {
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(device_), rank_, "cudaSetDevice"));
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                     rank_, "cudaStreamCreateWithFlags"));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config);
    if (comm_ == nullptr) return NcclError(r, nullptr, rank_, "ncclCommInitRankConfig");
    broken_ = AwaitNccl(comm_, r, deadline, rank_, "ncclCommInitRankConfig", timeout_);
    return broken_;
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }

  Status AllReduceSum(std::span<float> data) override {
    return Run("ncclAllReduce", data.data(), data.size_bytes(), [&](void* buffer) {
      return ncclAllReduce(buffer, buffer, data.size(), ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  Status AllReduceSum(std::span<double> data) override {
    return Run("ncclAllReduce", data.data(), data.size_bytes(), [&](void* buffer) {
      return ncclAllReduce(buffer, buffer, data.size(), ncclFloat64, ncclSum, comm_, stream_);
    });
  }

  Status Broadcast(std::span<uint8_t> data, int root) override {
    if (root < 0 || root >= world_size_) {
      return InvalidArgumentError("nccl broadcast: root " + std::to_string(root) + " outside [0, " +
                                  std::to_string(world_size_) + ")");
    }
    return Run("ncclBroadcast", data.data(), data.size(), [&](void* buffer) {
      return ncclBroadcast(buffer, buffer, data.size(), ncclUint8, root, comm_, stream_);
    });
  }

  // A one-element all-reduce: returns once every rank has entered it.
  Status Barrier() override {
    float one = 1.0f;
    ORRERY_RETURN_IF_ERROR(AllReduceSum(std::span<float>(&one, 1)));
    if (one != static_cast<float>(world_size_)) {
      return InternalError(Where(rank_) + "barrier summed to " + std::to_string(one) +
                           ", expected " + std::to_string(world_size_));
    }
    return Status::OK();
  }

 private:
  // Runs one collective in place on `bytes` host bytes at `host`. Any failure leaves the group in
  // an unknown state (peers may be waiting inside the collective): the communicator is aborted
  // and every later call returns the same error.
  template <typename Launch>
  Status Run(const char* call, void* host, size_t bytes, Launch launch) {
    if (bytes == 0) return Status::OK();
    if (!broken_.ok()) return broken_;
    Status s = RunOnce(call, host, bytes, launch);
    if (!s.ok()) {
      broken_ = s;
      Abort();
    }
    return s;
  }

  template <typename Launch>
  Status RunOnce(const char* call, void* host, size_t bytes, Launch launch) {
    const auto deadline = Clock::now() + timeout_;
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(device_), rank_, "cudaSetDevice"));
    ORRERY_RETURN_IF_ERROR(Reserve(bytes));
    std::memcpy(staging_, host, bytes);
    ORRERY_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpyAsync(device_buffer_, staging_, bytes, cudaMemcpyHostToDevice, stream_),
                  rank_, "cudaMemcpyAsync (to device)"));
    ORRERY_RETURN_IF_ERROR(
        AwaitNccl(comm_, launch(device_buffer_), deadline, rank_, call, timeout_));
    ORRERY_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpyAsync(staging_, device_buffer_, bytes, cudaMemcpyDeviceToHost, stream_),
                  rank_, "cudaMemcpyAsync (to host)"));
    ORRERY_RETURN_IF_ERROR(AwaitStream(call, deadline));
    std::memcpy(host, staging_, bytes);
    return Status::OK();
  }

  // Polls the stream until the collective and the copy back are done, NCCL reports an error
  // (a peer's connection broke), or the deadline passes (a peer died without NCCL noticing).
  Status AwaitStream(const char* call, Clock::time_point deadline) {
    Backoff backoff;
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status::OK();
      if (e != cudaErrorNotReady) return CudaCheck(e, rank_, "cudaStreamQuery");
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) {
        return NcclError(r, comm_, rank_, "ncclCommGetAsyncError");
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError(state, comm_, rank_, call);
      }
      if (Clock::now() >= deadline) {
        return DeadlineExceededError(Where(rank_) + call + " did not complete within " +
                                     std::to_string(timeout_.count()) +
                                     " ms (a peer died or stalled)");
      }
      backoff.Pause();
    }
  }

  // Grows the pinned staging buffer and the device buffer to at least `bytes`.
  Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return Status::OK();
    const size_t want = std::max(bytes, capacity_ * 2);
    if (device_buffer_ != nullptr) {
      ORRERY_RETURN_IF_ERROR(CudaCheck(cudaFree(device_buffer_), rank_, "cudaFree"));
      device_buffer_ = nullptr;
    }
    if (staging_ != nullptr) {
      ORRERY_RETURN_IF_ERROR(CudaCheck(cudaFreeHost(staging_), rank_, "cudaFreeHost"));
      staging_ = nullptr;
    }
    capacity_ = 0;
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaMalloc(&device_buffer_, want), rank_, "cudaMalloc"));
    ORRERY_RETURN_IF_ERROR(CudaCheck(cudaMallocHost(&staging_, want), rank_, "cudaMallocHost"));
    capacity_ = want;
    return Status::OK();
  }

  // For teardown, where an error can only be reported.
  void Warn(cudaError_t e, const char* call) const {
    if (e != cudaSuccess) ORRERY_LOG(WARN) << CudaCheck(e, rank_, call).message();
  }

  void Abort() {
    if (comm_ == nullptr) return;
    if (ncclResult_t r = ncclCommAbort(comm_); r != ncclSuccess && r != ncclInProgress) {
      ORRERY_LOG(WARN) << Where(rank_) << "ncclCommAbort failed: " << ncclGetErrorString(r);
    }
    comm_ = nullptr;
  }

  const int rank_;
  const int world_size_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* device_buffer_ = nullptr;
  void* staging_ = nullptr;  // pinned, so both copies are asynchronous and polled
  size_t capacity_ = 0;
  Status broken_;
};

}  // namespace

bool NcclAvailable() { return true; }

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgumentError("nccl: rank " + std::to_string(o.rank) + " outside world of " +
                                std::to_string(o.world_size));
  }
  if (o.store_dir.empty()) return InvalidArgumentError("nccl: store_dir is empty");
  if (o.timeout_ms <= 0) return InvalidArgumentError("nccl: timeout_ms must be > 0");
  if (o.device < -1) {
    return InvalidArgumentError("nccl: device " + std::to_string(o.device) +
                                " (expected a device index, or -1 for rank % devices)");
  }
  ORRERY_ASSIGN_OR_RETURN(const std::string id_file,
                          RendezvousFileName("nccl-unique-id", o.generation));
  const auto timeout = std::chrono::milliseconds(o.timeout_ms);
  const auto deadline = Clock::now() + timeout;

  int devices = 0;
  ORRERY_RETURN_IF_ERROR(CudaCheck(cudaGetDeviceCount(&devices), o.rank, "cudaGetDeviceCount"));
  if (devices == 0) return UnavailableError(Where(o.rank) + "no CUDA device is visible");
  const int device = o.device >= 0 ? o.device : o.rank % devices;
  if (device >= devices) {
    return InvalidArgumentError(Where(o.rank) + "device " + std::to_string(device) + " but only " +
                                std::to_string(devices) + " CUDA devices are visible");
  }

  ncclUniqueId id;
  if (o.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, nullptr, o.rank, "ncclGetUniqueId");
    }
    ORRERY_RETURN_IF_ERROR(
        PublishRendezvousFile(o.store_dir, id_file, std::string(id.internal, sizeof(id.internal))));
  } else {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    StatusOr<std::string> bytes = AwaitRendezvousFile(o.store_dir, id_file, sizeof(id.internal),
                                                      std::max(left, std::chrono::milliseconds(0)));
    if (!bytes.ok()) {
      return Status(bytes.status().code(), Where(o.rank) + "waiting for rank 0's unique id (" +
                                               bytes.status().message() + ")");
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }

  auto comm = std::make_unique<NcclCommunicator>(o.rank, o.world_size, device, timeout);
  if (Status s = comm->Init(id, deadline); !s.ok()) {
    return Status(s.code(), "nccl: rank " + std::to_string(o.rank) + " of " +
                                std::to_string(o.world_size) + " could not join through " +
                                o.store_dir + " (generation " + o.generation + ", device " +
                                std::to_string(device) + "): " + s.message());
  }
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace orrery::comm
