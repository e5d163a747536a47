// File rendezvous for a small value every rank needs before a communicator exists (the NCCL
// unique id): one rank publishes it atomically as DIR/NAME, the others poll for it until a
// deadline. DIR must be visible to every rank (a local directory for ranks on one host, a shared
// filesystem across hosts). Callers put the generation into NAME, so ranks restarted after a
// crash never read the value their dead predecessors left behind.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "core/status.h"

namespace orrery::comm {

// The file name for `prefix` in `generation`: "<prefix>-<generation>". The generation must be
// non-empty and made of [A-Za-z0-9._-] (it becomes part of a file name): InvalidArgument else.
StatusOr<std::string> RendezvousFileName(const std::string& prefix, const std::string& generation);

// Writes `value` to DIR/NAME atomically (temp file + rename), creating DIR if needed. A reader
// therefore sees either no file or the whole value. Overwrites an older value of the same name.
Status PublishRendezvousFile(const std::string& dir, const std::string& name,
                             const std::string& value);

// Waits until DIR/NAME exists and returns its contents, which must be exactly `expected_size`
// bytes (DataLoss otherwise: the file was not written by PublishRendezvousFile for this purpose).
// DeadlineExceeded, naming the file, when it has not appeared within `timeout`.
StatusOr<std::string> AwaitRendezvousFile(const std::string& dir, const std::string& name,
                                          size_t expected_size, std::chrono::milliseconds timeout);

}  // namespace orrery::comm
