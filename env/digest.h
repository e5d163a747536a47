// SHA-256, for detecting tampering with grader and test files (python environment).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace orrery::env {

// Lower-case hex SHA-256 of `data` (FIPS 180-4).
std::string Sha256Hex(std::string_view data);
// SHA-256 of a file's contents; IoError when it cannot be read.
StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace orrery::env
