#include "learner/comm/gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <chrono>
#include <exception>
#include <filesystem>

namespace orrery::comm {
namespace {

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }
  std::string backend() const override { return "gloo"; }

  Status AllReduceSum(std::span<float> data) override { return Reduce(data); }
  Status AllReduceSum(std::span<double> data) override { return Reduce(data); }

  Status Broadcast(std::span<uint8_t> data, int root) override {
    if (root < 0 || root >= world_size()) {
      return InvalidArgumentError("gloo broadcast: root " + std::to_string(root) + " outside [0, " +
                                  std::to_string(world_size()) + ")");
    }
    if (data.empty()) return Status::OK();
    return Guard("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setRoot(root);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Status Barrier() override {
    return Guard("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename T>
  Status Reduce(std::span<T> data) {
    if (data.empty()) return Status::OK();
    return Guard("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  template <typename Fn>
  Status Guard(const char* what, Fn fn) {
    if (!broken_.ok()) return broken_;
    try {
      fn();
      return Status::OK();
    } catch (const std::exception& e) {
      // A failed collective leaves the pairs in an unknown state: every later call fails too.
      broken_ = UnavailableError(std::string("gloo ") + what + " failed on rank " +
                                 std::to_string(rank()) + ": " + e.what());
      return broken_;
    }
  }

  uint32_t NextTag() { return next_tag_++; }

  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 1;
  Status broken_;
};

// A write to a socket whose peer is gone must fail with EPIPE (which Gloo turns into an
// exception, and Guard into a status) instead of killing the process.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgumentError("gloo: rank " + std::to_string(o.rank) + " outside world of " +
                                std::to_string(o.world_size));
  }
  if (o.store_dir.empty()) return InvalidArgumentError("gloo: store_dir is empty");
  if (o.timeout_ms <= 0) return InvalidArgumentError("gloo: timeout_ms must be > 0");
  std::error_code ec;
  std::filesystem::create_directories(o.store_dir, ec);
  if (ec) {
    return IoError("gloo: cannot create store directory " + o.store_dir + ": " + ec.message());
  }
  IgnoreSigpipeUnlessHandled();
  const auto timeout = std::chrono::milliseconds(o.timeout_ms);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(o.store_dir);
    gloo::rendezvous::PrefixStore store("gen-" + o.generation, file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world_size);
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(context), timeout));
  } catch (const std::exception& e) {
    return UnavailableError("gloo: rank " + std::to_string(o.rank) + " of " +
                            std::to_string(o.world_size) + " could not join through " +
                            o.store_dir + " (generation " + o.generation + "): " + e.what());
  }
}

}  // namespace orrery::comm
