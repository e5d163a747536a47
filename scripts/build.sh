#!/usr/bin/env bash
# Configures and builds Orrery with a CMake preset (default: "default" -> build/).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
preset="${1:-default}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
