#include "actors/runtime/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orrery {
namespace {

namespace fs = std::filesystem;

constexpr size_t kZ85KeyChars = 40;

std::string OctalMode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// The file's text without one trailing newline.
StatusOr<std::string> ReadKeyText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError(path + ": cannot read: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

Status WriteKeyFile(const std::string& path, const std::string& key, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoError("cannot create " + path, errno);
  const std::string text = key + "\n";
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  // The umask may have narrowed `mode`; set it exactly (0644 for the public key).
  const bool moded = fchmod(fd, mode) == 0;
  const bool synced = fsync(fd) == 0;
  close(fd);
  if (!written || !moded || !synced) return ErrnoError("cannot write " + path, err);
  return Status::OK();
}

}  // namespace

Status CheckCurveAvailable() {
  if (zmq_has("curve") == 0) {
    return FailedPreconditionError(
        "this libzmq was built without CURVE (zmq_has(\"curve\") is false): tcp endpoints of a "
        "fleet need it; install a libzmq built with libsodium");
  }
  return Status::OK();
}

bool IsZ85Key(const std::string& key) {
  static constexpr char kAlphabet[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  return key.size() == kZ85KeyChars && key.find_first_not_of(kAlphabet) == std::string::npos;
}

StatusOr<CurveKeyPair> GenerateCurveKeyPair() {
  ORRERY_RETURN_IF_ERROR(CheckCurveAvailable());
  char pub[kZ85KeyChars + 1] = {0};
  char sec[kZ85KeyChars + 1] = {0};
  if (zmq_curve_keypair(pub, sec) != 0) return ErrnoError("zmq_curve_keypair", zmq_errno());
  return CurveKeyPair{pub, sec};
}

Status WriteCurveKeyDir(const std::string& dir, const CurveKeyPair& keys) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) return IoError("cannot create the CURVE key directory " + dir + ": " + ec.message());
    fs::permissions(dir, fs::perms::owner_all, ec);
    if (ec) return IoError("cannot make " + dir + " private (0700): " + ec.message());
  }
  const std::string secret = (fs::path(dir) / kCurveSecretKeyFile).string();
  const std::string pub = (fs::path(dir) / kCurvePublicKeyFile).string();
  ORRERY_RETURN_IF_ERROR(WriteKeyFile(secret, keys.secret_key, 0600));
  fs::remove(pub, ec);  // a stale public key would not match the new secret one
  return WriteKeyFile(pub, keys.public_key, 0644);
}

StatusOr<CurveKeyPair> ReadCurveKeyDir(const std::string& dir) {
  ORRERY_RETURN_IF_ERROR(CheckCurveAvailable());
  const std::string secret_path = (fs::path(dir) / kCurveSecretKeyFile).string();
  struct stat st {};
  if (stat(secret_path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return NotFoundError(secret_path +
                           ": no such file (expected the fleet's CURVE secret key; `orrery fleet "
                           "keygen " +
                           dir + "` writes one)");
    }
    return ErrnoError("cannot stat " + secret_path, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(secret_path + ": not a regular file (expected a CURVE secret key)");
  }
  if ((st.st_mode & 077) != 0) {
    return FailedPreconditionError(secret_path + ": mode " + OctalMode(st.st_mode) +
                                   " lets its group or others at the fleet's secret key; expected "
                                   "0600 (chmod 600 " +
                                   secret_path + ")");
  }
  ORRERY_ASSIGN_OR_RETURN(std::string secret, ReadKeyText(secret_path));
  if (!IsZ85Key(secret)) {
    return InvalidArgumentError(secret_path +
                                ": expected a CURVE secret key (40 Z85 characters and a newline), "
                                "got " +
                                std::to_string(secret.size()) + " bytes" +
                                (secret.size() == kZ85KeyChars ? ", not all Z85" : ""));
  }
  char pub[kZ85KeyChars + 1] = {0};
  if (zmq_curve_public(pub, secret.c_str()) != 0) {
    return InvalidArgumentError(secret_path + ": not a valid Z85 CURVE secret key");
  }
  CurveKeyPair keys{pub, secret};
  const std::string pub_path = (fs::path(dir) / kCurvePublicKeyFile).string();
  std::error_code ec;
  if (fs::exists(pub_path, ec)) {
    ORRERY_ASSIGN_OR_RETURN(std::string written, ReadKeyText(pub_path));
    if (written != keys.public_key) {
      return InvalidArgumentError(pub_path + ": does not match " + secret_path +
                                  " (expected the public key of that secret key, " +
                                  keys.public_key + ")");
    }
  }
  return keys;
}

StatusOr<CurveKeyPair> EnsureCurveKeyDir(const std::string& dir, bool* generated) {
  if (generated != nullptr) *generated = false;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kCurveSecretKeyFile, ec)) return ReadCurveKeyDir(dir);
  ORRERY_ASSIGN_OR_RETURN(CurveKeyPair keys, GenerateCurveKeyPair());
  ORRERY_RETURN_IF_ERROR(WriteCurveKeyDir(dir, keys));
  if (generated != nullptr) *generated = true;
  return keys;
}

}  // namespace orrery
