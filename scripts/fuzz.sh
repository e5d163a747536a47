#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan, UBSan; tests/fuzz) and runs each for
# ORRERY_FUZZ_SECONDS (default 30) over its committed corpus in tests/fixtures/fuzz. Exits non-zero
# on a crash or a broken property; the input that caused it is in build-fuzz/fuzz-artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
cmake --preset fuzz -DORRERY_FUZZ_SECONDS="${ORRERY_FUZZ_SECONDS:-30}" >/dev/null
cmake --build --preset fuzz
ctest --test-dir build-fuzz -L libfuzzer --output-on-failure -j "$(nproc)"
