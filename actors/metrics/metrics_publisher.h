// How an actor reports metrics: each record is appended to the run's metrics.jsonl (the durable
// copy, what `orrery dashboard --run DIR` and `orrery export` read) and published as the same JSON
// line on a ZeroMQ PUB socket connected to the metrics hub (the live copy).
//
// PUB/SUB drops messages while the hub is away or slow; the file never does. A hub that starts
// late therefore misses early records live, and the file still has them.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "core/metrics.h"
#include "core/status.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace orrery {

struct MetricsPublisherOptions {
  std::string file;      // e.g. RUN/metrics.jsonl; empty: no file
  std::string endpoint;  // the hub's SUB endpoint (tcp://127.0.0.1:5570, ipc://...); empty: none
};

class MetricsPublisher {
 public:
  static StatusOr<std::unique_ptr<MetricsPublisher>> Open(const MetricsPublisherOptions& options);
  ~MetricsPublisher();

  // Thread-safe. Fails only when the file cannot be written; a hub that is not there is not an
  // error.
  Status Publish(const MetricRecord& record);

 private:
  MetricsPublisher() = default;
  std::unique_ptr<MetricsFileWriter> file_;
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::mutex mu_;
};

}  // namespace orrery
