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

bool EndpointIsLoopbackTcp(const std::string& endpoint) {
  if (!EndpointUsesCurve(endpoint)) return false;
  const std::string host = endpoint.substr(6);
  return host.rfind("127.", 0) == 0 || host.rfind("localhost:", 0) == 0 ||
         host.rfind("[::1]:", 0) == 0;
}

Status UseStandaloneServerKeys(const std::string& endpoint, const std::string& key_dir,
                               bool insecure) {
  if (!key_dir.empty()) return UseFleetCurveKeyDir(key_dir);
  if (!EndpointUsesCurve(endpoint) || EndpointIsLoopbackTcp(endpoint) || insecure) {
    return Status::OK();
  }
  return FailedPreconditionError(
      endpoint +
      ": a tcp endpoint beyond loopback needs --curve-key-dir DIR (`orrery fleet keygen "
      "DIR` makes the keys; clients pass the same directory), or --insecure-plain-tcp to serve "
      "anyone who can reach it");
}

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
