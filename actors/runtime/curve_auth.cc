#include "actors/runtime/curve_auth.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/logging.h"

namespace orrery {
namespace {

std::atomic<uint64_t> g_refused{0};

// Contexts with a running handler. Leaked on purpose: a handler thread may finish (its context
// terminating) while static destructors run at exit.
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
class ZapHandler;
std::map<void*, ZapHandler*>& Registry() {
  static auto* handlers = new std::map<void*, ZapHandler*>;
  return *handlers;
}

std::string Z85(const std::string& binary_key) {
  if (binary_key.size() != 32) return "(" + std::to_string(binary_key.size()) + " bytes)";
  char text[41] = {0};
  zmq_z85_encode(text, reinterpret_cast<const uint8_t*>(binary_key.data()), 32);
  return text;
}

class ZapHandler {
 public:
  ZapHandler(zmq::context_t& zmq, const std::string& allowed_public_key)
      : context_(zmq.handle()), zap_(zmq, zmq::socket_type::rep), allowed_(32, '\0') {
    if (zmq_z85_decode(reinterpret_cast<uint8_t*>(allowed_.data()), allowed_public_key.c_str()) ==
        nullptr) {
      throw zmq::error_t();  // EINVAL from zmq_z85_decode
    }
    zap_.set(zmq::sockopt::linger, 0);
    zap_.bind("inproc://zeromq.zap.01");
  }

  // Hands over a PAIR socket connected to a server socket's monitor (from the binding thread).
  void AddMonitor(std::unique_ptr<zmq::socket_t> monitor) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending_.push_back(std::move(monitor));
  }

  // The thread's body: serves until the context terminates, then deletes itself.
  void Run() {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(pending_mu_);
        for (auto& m : pending_) monitors_.push_back(std::move(m));
        pending_.clear();
      }
      std::vector<zmq::pollitem_t> items = {{zap_.handle(), 0, ZMQ_POLLIN, 0}};
      for (auto& m : monitors_) items.push_back({m->handle(), 0, ZMQ_POLLIN, 0});
      try {
        // New monitors are picked up within one timeout.
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
        if (items[0].revents & ZMQ_POLLIN) ServeZap();
        for (size_t i = items.size() - 1; i >= 1; --i) {
          if ((items[i].revents & ZMQ_POLLIN) && !ReadEvent(*monitors_[i - 1])) {
            monitors_.erase(monitors_.begin() + static_cast<long>(i - 1));
          }
        }
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) break;
        if (e.num() == EINTR) continue;
        ORRERY_LOG(ERROR) << "CURVE ZAP handler stopped: " << e.what();
        break;
      }
    }
    {
      std::lock_guard<std::mutex> lock(RegistryMutex());
      Registry().erase(context_);
    }
    // The context's termination waits for these sockets; close them before this thread ends.
    delete this;
  }

 private:
  void ServeZap() {
    std::vector<zmq::message_t> frames;
    while (true) {
      zmq::message_t frame;
      if (!zap_.recv(frame, zmq::recv_flags::dontwait)) break;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
    if (frames.empty()) return;
    // [version, request id, domain, address, routing id, mechanism, credentials...]
    std::string code = "500", text = "malformed ZAP request";
    if (frames.size() >= 6) {
      const std::string domain = frames[2].to_string();
      const std::string address = frames[3].to_string();
      const std::string mechanism = frames[5].to_string();
      const std::string key = frames.size() >= 7 ? frames[6].to_string() : "";
      if (domain != kFleetZapDomain) {
        code = "200", text = "OK";
      } else if (mechanism == "CURVE" && key == allowed_) {
        code = "200", text = "OK";
      } else {
        code = "400", text = "not a member of the fleet";
        Refused("tcp peer " + address, mechanism == "CURVE"
                                           ? "CURVE public key " + Z85(key) + " is not the fleet's"
                                           : "mechanism " + mechanism + " on a fleet socket");
      }
    }
    const std::string version = "1.0";
    const std::string request_id = frames.size() >= 2 ? frames[1].to_string() : "";
    const std::string user = code == "200" ? "fleet" : "";
    zap_.send(zmq::buffer(version), zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(code), zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(text), zmq::send_flags::sndmore);
    zap_.send(zmq::buffer(user), zmq::send_flags::sndmore);
    zap_.send(zmq::message_t(), zmq::send_flags::none);
  }

  // False once the monitored socket has closed.
  bool ReadEvent(zmq::socket_t& monitor) {
    zmq::message_t head, endpoint;
    if (!monitor.recv(head, zmq::recv_flags::dontwait)) return true;
    if (head.more()) (void)monitor.recv(endpoint, zmq::recv_flags::none);
    if (head.size() < 6) return true;
    uint16_t event = 0;
    uint32_t value = 0;
    std::memcpy(&event, head.data(), sizeof(event));
    std::memcpy(&value, static_cast<const char*>(head.data()) + 2, sizeof(value));
    if (event == ZMQ_EVENT_MONITOR_STOPPED) return false;
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      std::string why;
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
        why = "a peer without CURVE (plain ZeroMQ) tried it";
      } else if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC) {
        why = "a peer's CURVE handshake failed (it does not hold the fleet's keys)";
      } else {
        char hex[16];
        std::snprintf(hex, sizeof(hex), "0x%08x", value);
        why = std::string("handshake protocol error ") + hex;
      }
      Refused("a peer of " + endpoint.to_string(), why);
    }
    return true;
  }

  void Refused(const std::string& peer, const std::string& why) {
    const uint64_t n = g_refused.fetch_add(1, std::memory_order_relaxed) + 1;
    const auto now = std::chrono::steady_clock::now();
    auto it = last_logged_.find(peer);
    if (it != last_logged_.end() && now - it->second < std::chrono::minutes(1)) return;
    if (last_logged_.size() >= 1024) last_logged_.clear();  // bounded under a scan
    last_logged_[peer] = now;
    ORRERY_LOG(WARN) << "refused " << peer << ": " << why << " (" << n
                     << " refused so far; one line per peer per minute)";
  }

  void* context_;
  zmq::socket_t zap_;
  std::string allowed_;  // binary, 32 bytes
  std::vector<std::unique_ptr<zmq::socket_t>> monitors_;
  std::mutex pending_mu_;
  std::vector<std::unique_ptr<zmq::socket_t>> pending_;
  std::map<std::string, std::chrono::steady_clock::time_point> last_logged_;
};

std::atomic<uint64_t> g_monitor_id{0};

}  // namespace

void StartZapHandler(zmq::context_t& zmq, const std::string& allowed_public_key) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  if (Registry().count(zmq.handle())) return;
  auto* handler = new ZapHandler(zmq, allowed_public_key);  // throws before registering
  Registry()[zmq.handle()] = handler;
  std::thread([handler] {
    ScopedLogPrefix prefix("curve");
    handler->Run();
  }).detach();
}

void WatchCurveHandshakes(zmq::context_t& zmq, zmq::socket_t& socket) {
  const std::string address =
      "inproc://orrery-curve-monitor-" + std::to_string(g_monitor_id.fetch_add(1));
  // LISTENING is asked for only to be dropped: the bind that follows sends it from this thread,
  // which attaches the monitor's pipe to `monitor`. Without it, the first event comes from an I/O
  // thread, and libzmq was seen to drop every event of a socket that way.
  if (zmq_socket_monitor(socket.handle(), address.c_str(),
                         ZMQ_EVENT_LISTENING | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_MONITOR_STOPPED) != 0) {
    throw zmq::error_t();
  }
  auto monitor = std::make_unique<zmq::socket_t>(zmq, zmq::socket_type::pair);
  monitor->set(zmq::sockopt::linger, 0);
  monitor->connect(address);
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(zmq.handle());
  if (it == Registry().end()) {
    zmq_socket_monitor(socket.handle(), nullptr, 0);
    throw zmq::error_t();  // no handler: StartZapHandler first
  }
  it->second->AddMonitor(std::move(monitor));
}

uint64_t CurveRefusedTotal() { return g_refused.load(std::memory_order_relaxed); }

}  // namespace orrery
