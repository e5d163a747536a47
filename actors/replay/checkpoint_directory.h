#pragma once

#include <string>

#include "core/status.h"

namespace orrery::replay {

// Where a checkpoint asked for over the wire may be written: only under the store's configured
// checkpoint root (replay.checkpoint_dir). A client of the store is not trusted with the store's
// file system: without this check any peer could make the store create a RocksDB checkpoint (hard
// links to its files, which then outlive the store's own deletions) at any path it can write.
//
// `requested` empty: returns "" (the store names a new directory under the root). Otherwise it
// must be a relative path of plain names (no "", ".", ".." component, not absolute) and no
// existing component below the root may be a symbolic link; returns root/requested.
// InvalidArgument with one line naming the path otherwise.
StatusOr<std::string> CheckpointDirectoryUnder(const std::string& root,
                                               const std::string& requested);

}  // namespace orrery::replay
