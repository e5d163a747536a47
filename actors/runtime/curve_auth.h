// Who may complete a CURVE handshake with a server socket of this process, and the count of those
// refused.
//
// ZeroMQ asks a ZAP handler (RFC 27, inproc://zeromq.zap.01 of the socket's context) about every
// CURVE client once the client has proven it holds the secret key of the public key it presents.
// StartZapHandler runs that handler for one context, on a thread of its own: it admits exactly the
// fleet's public key and refuses every other. The thread touches no actor state (the allowed key
// is fixed, the counter atomic), so it stands beside the actor's one event loop rather than in it:
// ZeroMQ's I/O threads wait on its answer during handshakes, which a long handler on the loop
// would delay. It ends by itself when the context terminates.
//
// Peers that fail earlier never reach ZAP: a plain ZeroMQ peer (mechanism mismatch) or one that
// does not hold the fleet's public key as server key (cryptographic error). WatchCurveHandshakes
// attaches a socket monitor to a server socket so that those are counted and logged too, by the
// same thread.
//
// Each refusal adds one to CurveRefusedTotal() (a connection attempt: a peer that keeps
// reconnecting is counted each time) and logs one line per peer per minute: the peer's address and
// key for ZAP refusals, the socket's endpoint for handshake failures (libzmq does not report the
// peer's address there).
#pragma once

#include <cstdint>
#include <string>
#include <zmq.hpp>

namespace orrery {

// The ZAP domain of the fleet's CURVE server sockets. Requests for any other domain (no socket of
// Orrery sets one) are admitted: they are not the fleet's to judge.
inline constexpr char kFleetZapDomain[] = "orrery-fleet";

// Starts the ZAP handler of `zmq` admitting `allowed_public_key` (Z85); does nothing when this
// context has one already. Throws zmq::error_t when inproc://zeromq.zap.01 is taken by a handler
// that is not ours.
void StartZapHandler(zmq::context_t& zmq, const std::string& allowed_public_key);

// Counts and logs the handshakes of `socket` (a CURVE server on `zmq`, whose ZAP handler runs)
// that fail before ZAP is asked. Throws zmq::error_t when the monitor cannot be attached.
void WatchCurveHandshakes(zmq::context_t& zmq, zmq::socket_t& socket);

// Peers refused by any CURVE server socket of this process since it started.
uint64_t CurveRefusedTotal();

}  // namespace orrery
