#!/usr/bin/env bash
# Installs dependencies, builds Orrery and runs every test. Exits non-zero on any failure and ends
# with CTest's summary line. Extra arguments go to ctest (e.g. -R Config, -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/env.sh
./scripts/build.sh default
jobs="$(nproc)"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900 "$@"
