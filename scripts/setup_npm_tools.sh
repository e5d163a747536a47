#!/usr/bin/env bash
# Installs the npm packages the environment tests run (the MCP filesystem server that
# tests/unit/env/mcp_test.cc starts inside the sandbox) into .cache/npm, a project-local,
# git-ignored folder. Idempotent: does nothing when the pinned version is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
pkg="@modelcontextprotocol/server-filesystem"
version="2026.8.31"
dir=".cache/npm"
installed="$dir/node_modules/$pkg/package.json"
if [ -f "$installed" ] && grep -q "\"version\": \"$version\"" "$installed"; then
  echo "setup: $pkg $version present in $dir"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: npm is missing; run as root: apt-get install nodejs npm" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$pkg@$version" >/dev/null
echo "setup: installed $pkg $version into $dir"
