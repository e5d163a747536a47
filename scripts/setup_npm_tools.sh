#!/usr/bin/env bash
# Installs the npm packages the environment tests run (the MCP servers that
# tests/unit/env/mcp_test.cc starts inside the sandbox: server-filesystem and server-everything)
# into .cache/npm, a project-local, git-ignored folder. Idempotent: does nothing when the pinned
# versions are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=("@modelcontextprotocol/server-filesystem@2026.8.31"
      "@modelcontextprotocol/server-everything@2026.8.31")
dir=".cache/npm"
missing=()
for spec in "${pkgs[@]}"; do
  pkg="${spec%@*}"
  version="${spec##*@}"
  installed="$dir/node_modules/$pkg/package.json"
  if ! { [ -f "$installed" ] && grep -q "\"version\": \"$version\"" "$installed"; }; then
    missing+=("$spec")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: ${pkgs[*]} present in $dir"
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
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${missing[@]}" >/dev/null
echo "setup: installed ${missing[*]} into $dir"
