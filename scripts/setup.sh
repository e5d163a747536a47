#!/usr/bin/env bash
# Installs every Debian package Orrery needs to build, test and run. Idempotent: packages already
# present are not touched, and `apt-get update` runs at most once, only when something is missing.
# Run as root (CI does); otherwise it prints the command to run and exits non-zero.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config git ca-certificates
  # the libFuzzer targets (scripts/fuzz.sh): clang with compiler-rt's fuzzer and sanitizers
  clang libclang-rt-14-dev
  # libraries (see docs/architecture.md and ../shared/spec/deps.md for the pitfalls)
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev librocksdb-dev libabsl-dev libcli11-dev
  libgtest-dev libgmock-dev libtomlplusplus-dev libcpp-httplib-dev nlohmann-json3-dev
  libopenblas-dev libgloo-dev libseccomp-dev prometheus-cpp-dev libbenchmark-dev
  # runtime tools: the sandbox, the python environment's interpreter, text corpora for pretraining
  bubblewrap python3 bible-kjv fortunes-min
  # dashboard tests: headless browser (tests/browser) and promtool (checks the /metrics exposition)
  chromium prometheus
  # cluster launch tests: a one-node Slurm cluster (tests/integration/slurm_test.sh)
  slurm-wlm munge
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The dashboard bundles its page from npm packages at build time: Node.js with npm (a nodejs
# package that ships npm itself counts; otherwise Debian's nodejs and npm).
if ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
# The Kubernetes manifests are checked by kubectl (client-side, no cluster): Debian's
# kubernetes-client, unless a kubectl is already installed (another package's would conflict).
if ! command -v kubectl >/dev/null 2>&1; then
  missing+=(kubernetes-client)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exec "$(dirname "$0")/setup_npm_tools.sh"  # npm packages the tests run (MCP servers)
fi

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run as root: sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
exec "$(dirname "$0")/setup_npm_tools.sh"  # npm packages the tests run (MCP servers)
