#!/usr/bin/env bash
# Installs dependencies, builds Orrery and runs every test, then (without arguments) the libFuzzer
# targets for ORRERY_FUZZ_SECONDS each (scripts/fuzz.sh). Exits non-zero on any failure. Extra
# arguments go to the main ctest run only (e.g. -R Config, -L unit), and skip the fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
source scripts/env.sh
./scripts/build.sh default
jobs="$(nproc)"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900 "$@"
# The whole suite (no ctest arguments) also runs the coverage-guided fuzzers.
if [[ $# -eq 0 ]]; then
  ./scripts/fuzz.sh
fi
