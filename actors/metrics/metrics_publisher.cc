#include "actors/metrics/metrics_publisher.h"

#include <filesystem>
#include <zmq.hpp>

#include "actors/runtime/fleet_curve.h"
#include "core/message_limits.h"

namespace orrery {

StatusOr<std::unique_ptr<MetricsPublisher>> MetricsPublisher::Open(
    const MetricsPublisherOptions& options) {
  std::unique_ptr<MetricsPublisher> self(new MetricsPublisher());
  if (!options.file.empty()) {
    if (const std::filesystem::path parent = std::filesystem::path(options.file).parent_path();
        !parent.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(parent, ec);
      if (ec) return IoError("metrics: creating " + parent.string() + ": " + ec.message());
    }
    ORRERY_ASSIGN_OR_RETURN(self->file_, MetricsFileWriter::Open(options.file));
  }
  if (!options.endpoint.empty()) {
    try {
      self->context_ = std::make_unique<zmq::context_t>(1);
      self->socket_ = std::make_unique<zmq::socket_t>(*self->context_, zmq::socket_type::pub);
      self->socket_->set(zmq::sockopt::linger, 200);
      self->socket_->set(zmq::sockopt::maxmsgsize, MaxMessageBytes());
      self->socket_->set(zmq::sockopt::sndhwm, 10000);
      SecureFleetSocket(*self->context_, *self->socket_, options.endpoint, SocketSide::kConnect);
      self->socket_->connect(options.endpoint);
    } catch (const zmq::error_t& e) {
      return InvalidArgumentError("metrics endpoint '" + options.endpoint + "': " + e.what());
    }
  }
  return self;
}

MetricsPublisher::~MetricsPublisher() {
  socket_.reset();
  context_.reset();
}

Status MetricsPublisher::Publish(const MetricRecord& record) {
  if (file_) ORRERY_RETURN_IF_ERROR(file_->Write(record));
  if (socket_) {
    const std::string line = record.ToJson();
    std::lock_guard<std::mutex> lock(mu_);
    // Non-blocking: a missing or slow hub drops live records (the file keeps them).
    (void)socket_->send(zmq::buffer(line), zmq::send_flags::dontwait);
  }
  return Status::OK();
}

}  // namespace orrery
