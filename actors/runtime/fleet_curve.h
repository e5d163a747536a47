// Which sockets of the fleet authenticate, and with what: the one place that decides.
//
// A socket whose endpoint is tcp:// uses CURVE with the fleet's keypair (actors/runtime/
// curve_keys.h): a socket that binds is a CURVE server whose clients must present the fleet's
// public key (its context's ZAP handler checks, actors/runtime/curve_auth.h); a socket that
// connects is a CURVE client holding the fleet's keypair and expecting the fleet's key as the
// server's. ipc:// and inproc:// sockets stay plain: an ipc socket is a file under the run
// directory (the file system's permissions decide who connects), inproc never leaves the process.
//
// The keys are process-wide, like the size limit of core/message_limits.h: `orrery launch` sets
// them (generated into <run.dir>/curve, or read from fleet.curve_key_dir) and every actor it
// spawns reads the same directory (`orrery actor --curve-key-dir`). Every socket of the fleet
// (actor mailboxes and clients, the replay store and its clients, the env server, the metrics hub
// and publishers, the launcher's metrics PUB) calls SecureFleetSocket right before its bind or
// connect. Without keys a tcp socket stays plain: standalone tools (`orrery replay serve`); a
// fleet's actor refuses to start on tcp without keys (`orrery actor`).
#pragma once

#include <optional>
#include <string>
#include <zmq.hpp>

#include "actors/runtime/curve_keys.h"

namespace orrery {

// Sets (or, with nullopt, clears) this process's fleet keys. Thread-safe; sockets already bound or
// connected keep what they had.
void SetFleetCurveKeys(std::optional<CurveKeyPair> keys);
std::optional<CurveKeyPair> FleetCurveKeys();
// ReadCurveKeyDir(dir), then SetFleetCurveKeys: what a command given --curve-key-dir DIR does.
Status UseFleetCurveKeyDir(const std::string& dir);

// True for tcp:// endpoints.
bool EndpointUsesCurve(const std::string& endpoint);
// True for tcp:// endpoints on a loopback address (127.x.y.z, localhost, [::1]): reachable only
// from this machine.
bool EndpointIsLoopbackTcp(const std::string& endpoint);

// The standalone servers (`orrery replay serve`, `orrery env serve`): given `key_dir` (their
// --curve-key-dir) they load it and their tcp endpoint authenticates like a fleet's; without it
// a tcp endpoint beyond loopback is refused with one line unless `insecure` (--insecure-plain-tcp)
// — a stranger who reaches a plain store can evict or delete everything.
Status UseStandaloneServerKeys(const std::string& endpoint, const std::string& key_dir,
                               bool insecure);

enum class SocketSide { kBind, kConnect };

// Call right before `socket`.bind/connect(`endpoint`). For tcp with keys set: CURVE options, and
// for a bind the ZAP domain, the context's ZAP handler (started on first use) and a monitor of
// failed handshakes. Otherwise nothing. Throws zmq::error_t like the bind or connect it precedes.
void SecureFleetSocket(zmq::context_t& zmq, zmq::socket_t& socket, const std::string& endpoint,
                       SocketSide side);

}  // namespace orrery
