#include "actors/runtime/fleet_curve.h"

#include <mutex>

#include "actors/runtime/curve_auth.h"

namespace orrery {
namespace {

std::mutex g_mu;
std::optional<CurveKeyPair> g_keys;

}  // namespace

void SetFleetCurveKeys(std::optional<CurveKeyPair> keys) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_keys = std::move(keys);
}

std::optional<CurveKeyPair> FleetCurveKeys() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_keys;
}

Status UseFleetCurveKeyDir(const std::string& dir) {
  ORRERY_ASSIGN_OR_RETURN(CurveKeyPair keys, ReadCurveKeyDir(dir));
  SetFleetCurveKeys(std::move(keys));
  return Status::OK();
}

bool EndpointUsesCurve(const std::string& endpoint) { return endpoint.rfind("tcp://", 0) == 0; }

void SecureFleetSocket(zmq::context_t& zmq, zmq::socket_t& socket, const std::string& endpoint,
                       SocketSide side) {
  if (!EndpointUsesCurve(endpoint)) return;
  const std::optional<CurveKeyPair> keys = FleetCurveKeys();
  if (!keys) return;
  if (side == SocketSide::kBind) {
    StartZapHandler(zmq, keys->public_key);
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, keys->secret_key);
    socket.set(zmq::sockopt::zap_domain, kFleetZapDomain);
    WatchCurveHandshakes(zmq, socket);
  } else {
    socket.set(zmq::sockopt::curve_serverkey, keys->public_key);
    socket.set(zmq::sockopt::curve_publickey, keys->public_key);
    socket.set(zmq::sockopt::curve_secretkey, keys->secret_key);
  }
}

}  // namespace orrery
