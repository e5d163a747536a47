// Reading a whole file: the one helper every module uses for configs, tokenizers, manifests and
// checkpoint metadata (writing goes through WriteFileAtomic in core/safetensors.h).
#pragma once

#include <string>

#include "core/status.h"

namespace orrery {

// The file's bytes. NotFound ("<path>: cannot open") when it cannot be opened; IoError when the
// read fails part-way.
StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace orrery
