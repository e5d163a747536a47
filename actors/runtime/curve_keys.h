// The fleet's CURVE keypair on disk (ZeroMQ's CurveZMQ: Curve25519 keys written as Z85 text).
//
//   ORRERY_ASSIGN_OR_RETURN(CurveKeyPair keys, EnsureCurveKeyDir(run_dir + "/curve", &made));
//   ORRERY_ASSIGN_OR_RETURN(CurveKeyPair same, ReadCurveKeyDir(run_dir + "/curve"));
//
// A key directory holds one keypair:
//   fleet.key  the secret key: 40 Z85 characters and a newline. Mode 0600 (0400 is fine): a file
//              that its group or others may read, write or execute is refused, since whoever reads
//              it is a member of the fleet.
//   fleet.pub  the public key (0644), derived from the secret key. Optional when reading; when
//              present it must match fleet.key (a directory assembled from two runs is refused).
// Every error is one line naming the file and what was expected.
#pragma once

#include <string>

#include "core/status.h"

namespace orrery {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

inline constexpr char kCurveSecretKeyFile[] = "fleet.key";
inline constexpr char kCurvePublicKeyFile[] = "fleet.pub";

// FailedPrecondition, in one line, when this libzmq was built without CURVE (libsodium).
Status CheckCurveAvailable();

// A fresh keypair (zmq_curve_keypair).
StatusOr<CurveKeyPair> GenerateCurveKeyPair();

// True when `key` is 40 characters of the Z85 alphabet.
bool IsZ85Key(const std::string& key);

// Writes `dir`/fleet.key (0600, created exclusively: an existing key is never overwritten) and
// `dir`/fleet.pub, creating `dir` (0700) when it does not exist.
Status WriteCurveKeyDir(const std::string& dir, const CurveKeyPair& keys);

// Reads `dir`/fleet.key: checks its mode and text, derives the public key and checks it against
// `dir`/fleet.pub when that exists.
StatusOr<CurveKeyPair> ReadCurveKeyDir(const std::string& dir);

// ReadCurveKeyDir when `dir`/fleet.key exists; otherwise generates a keypair, writes it there and
// sets *generated (may be null).
StatusOr<CurveKeyPair> EnsureCurveKeyDir(const std::string& dir, bool* generated);

}  // namespace orrery
