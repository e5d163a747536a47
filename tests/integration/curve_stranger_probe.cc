// A stranger to a fleet (see fleet_curve_test.sh): sends one request to ENDPOINT as a plain
// ZeroMQ peer and, given the fleet's public key file, as a CURVE peer with a keypair of its own,
// and expects nothing back from either.
//
//   curve_stranger_probe ENDPOINT [FLEET_PUB_FILE]
//
// The request is a coordinator.Register in the actors' wire format (a replay store answers any
// two-frame message too, with an error: a reply of any kind means the stranger was served).
// Exit 0 and "nothing from ENDPOINT" when no reply came; 1 with one line otherwise.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <zmq.hpp>

#include "actors/runtime/coordinator_protocol.h"
#include "actors/runtime/curve_keys.h"
#include "actors/runtime/wire.h"
#include "actors/schema/actor.capnp.h"

using namespace orrery;

namespace {

// True when the peer answered within 1.5 s.
bool Answered(const std::string& endpoint, const std::string& server_key) {
  zmq::context_t zmq;
  zmq::socket_t dealer(zmq, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  if (!server_key.empty()) {
    const CurveKeyPair own = GenerateCurveKeyPair().value();
    dealer.set(zmq::sockopt::curve_serverkey, server_key);
    dealer.set(zmq::sockopt::curve_publickey, own.public_key);
    dealer.set(zmq::sockopt::curve_secretkey, own.secret_key);
  }
  dealer.connect(endpoint);
  Envelope env;
  env.method = coordinator_methods::kRegister;
  env.request_id = 1;
  env.sender = "stranger:0";
  capnp::MallocMessageBuilder body;
  auto req = body.initRoot<schema::RegisterRequest>();
  req.setName("stranger:0");
  req.setRole("echo");
  req.setEndpoint("tcp://192.0.2.1:1");
  req.setReady(true);
  (void)SendWireMessage(dealer, nullptr, env, &body);
  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, std::chrono::milliseconds(1500));
  return (item.revents & ZMQ_POLLIN) != 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: curve_stranger_probe ENDPOINT [FLEET_PUB_FILE]\n");
    return 2;
  }
  const std::string endpoint = argv[1];
  if (Answered(endpoint, "")) {
    std::fprintf(stderr, "curve_stranger_probe: %s answered a plain peer\n", endpoint.c_str());
    return 1;
  }
  if (argc == 3) {
    std::string key;
    std::ifstream(argv[2]) >> key;
    if (!IsZ85Key(key)) {
      std::fprintf(stderr, "curve_stranger_probe: %s: expected a Z85 public key\n", argv[2]);
      return 2;
    }
    if (Answered(endpoint, key)) {
      std::fprintf(stderr, "curve_stranger_probe: %s answered a peer with its own keypair\n",
                   endpoint.c_str());
      return 1;
    }
  }
  std::printf("nothing from %s\n", endpoint.c_str());
  return 0;
}
