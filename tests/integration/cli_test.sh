#!/usr/bin/env bash
# The orrery CLI: help lists subcommands, version prints, config check reports bad files in one
# line with a non-zero exit and prints resolved values for good ones.
set -uo pipefail
orrery="$1"
src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$orrery" --help | grep -q "config" || fail "--help does not list the config subcommand"
"$orrery" --version | grep -qE "^orrery [0-9]+\.[0-9]+\.[0-9]+" || fail "--version"

printf '[run]\nseed = 3\n\nsed = 4\n' > "$tmp/unknown.toml"
out="$("$orrery" config check "$tmp/unknown.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "unknown key exited 0"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "unknown key printed more than one line: $out"
[ "$out" = "orrery: $tmp/unknown.toml:4: unknown key 'run.sed'" ] || fail "unexpected message: $out"

printf '[run\n' > "$tmp/malformed.toml"
out="$("$orrery" config check "$tmp/malformed.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "malformed TOML exited 0"
case "$out" in "orrery: $tmp/malformed.toml:1: invalid TOML"*) ;; *) fail "malformed: $out" ;; esac

out="$("$orrery" config check "$tmp/missing.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "missing file exited 0"
[ "$out" = "orrery: $tmp/missing.toml: config file not found" ] || fail "missing: $out"

out="$("$orrery" config check "$src/configs/run.toml")" || fail "configs/run.toml rejected"
printf '%s\n' "$out" | grep -q '^run.seed = 1234$' || fail "resolved values not printed: $out"
echo "cli_test: all checks passed"
