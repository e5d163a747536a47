#!/usr/bin/env bash
# The replay actor end to end: a bad table config exits with one clear line; a running store
# survives clients sending garbage and keeps serving info and checkpoints.
set -uo pipefail
orrery="$1"
client="$2"   # replay_client_probe: inserts, samples and sends garbage
tmp="$(mktemp -d)"
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/server.log" ] && tail -5 "$tmp/server.log"; exit 1; }

# Bad limiter: the error buffer is smaller than 2 * max(1, SPI).
cat > "$tmp/bad.toml" <<TOML
[replay]
path = "db"
[[replay.tables]]
name = "t"
[replay.tables.rate_limiter]
kind = "sample_to_insert_ratio"
samples_per_insert = 4.0
min_size_to_sample = 10
error_buffer = 3.0
TOML
out="$("$orrery" replay serve --config "$tmp/bad.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "bad limiter config exited 0"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "bad config printed more than one line: $out"
case "$out" in *"bad.toml"*"replay.tables"*"error buffer"*) ;; *) fail "unclear message: $out" ;; esac

printf '[replay]\npath = "db"\n[[replay.tables]]\nname = "t"\nsampler = "random"\n' > "$tmp/bad2.toml"
out="$("$orrery" replay serve --config "$tmp/bad2.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "unknown sampler exited 0"
case "$out" in *"replay.tables"*"sampler"*) ;; *) fail "unclear message: $out" ;; esac

port=$((20000 + RANDOM % 20000))
cat > "$tmp/good.toml" <<TOML
[replay]
bind = "tcp://127.0.0.1:$port"
path = "db"
checkpoint_dir = "ckpt"
[[replay.tables]]
name = "t"
max_size = 100
max_item_bytes = 1000000
TOML
"$orrery" replay serve --config "$tmp/good.toml" > "$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do grep -q "serving" "$tmp/server.log" && break; sleep 0.1; done
grep -q "serving" "$tmp/server.log" || fail "server did not start"

"$client" "tcp://127.0.0.1:$port" || fail "client probe"
kill -0 "$server_pid" || fail "server died"
out="$("$orrery" replay info --connect "tcp://127.0.0.1:$port")" || fail "info: $out"
printf '%s\n' "$out" | grep -q "^t: size" || fail "info output: $out"
ck="$("$orrery" replay checkpoint --connect "tcp://127.0.0.1:$port")" || fail "checkpoint: $ck"
[ -f "$ck/CURRENT" ] || fail "checkpoint dir $ck has no CURRENT"
# A client names a checkpoint under replay.checkpoint_dir; it cannot make the store write elsewhere.
ck="$("$orrery" replay checkpoint --connect "tcp://127.0.0.1:$port" --dir nightly/1)" ||
  fail "named checkpoint: $ck"
case "$ck" in */ckpt/nightly/1) ;; *) fail "named checkpoint went to $ck" ;; esac
[ -f "$ck/CURRENT" ] || fail "checkpoint dir $ck has no CURRENT"
for bad in "$tmp/outside" "../outside"; do
  out="$("$orrery" replay checkpoint --connect "tcp://127.0.0.1:$port" --dir "$bad" 2>&1)"; rc=$?
  [ $rc -ne 0 ] || fail "a checkpoint to $bad exited 0: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "more than one line for $bad: $out"
  case "$out" in *"replay.checkpoint_dir"*) ;; *) fail "unclear message for $bad: $out" ;; esac
  [ ! -e "$tmp/outside" ] || fail "a checkpoint was written outside replay.checkpoint_dir"
done
out="$("$orrery" replay info --connect "tcp://127.0.0.1:1" --timeout-ms 300 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "info against nothing exited 0"
kill "$server_pid"; wait "$server_pid"; rc=$?; server_pid=""
[ $rc -eq 0 ] || fail "server exit code $rc after SIGTERM"

# Beyond loopback a standalone store needs keys (or says it serves anyone): one line, non-zero.
out="$("$orrery" replay serve --config "$tmp/good.toml" --bind "tcp://*:$port" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "a plain store on tcp://* started"
[ "$(printf '%s
' "$out" | wc -l)" -eq 1 ] || fail "more than one line: $out"
case "$out" in *"--curve-key-dir"*"--insecure-plain-tcp"*) ;; *) fail "unclear message: $out" ;; esac
# With keys it serves tcp://* over CURVE: a client with the keys is answered, one without is not.
"$orrery" fleet keygen "$tmp/keys" > /dev/null || fail "fleet keygen"
"$orrery" replay serve --config "$tmp/good.toml" --bind "tcp://*:$port" \
  --curve-key-dir "$tmp/keys" > "$tmp/server2.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do grep -q "serving" "$tmp/server2.log" && break; sleep 0.1; done
grep -q "serving" "$tmp/server2.log" || fail "keyed server did not start: $(cat "$tmp/server2.log")"
out="$("$orrery" replay info --connect "tcp://127.0.0.1:$port" --curve-key-dir "$tmp/keys")" ||
  fail "keyed info: $out"
printf '%s
' "$out" | grep -q "^t: size" || fail "keyed info output: $out"
out="$("$orrery" replay info --connect "tcp://127.0.0.1:$port" --timeout-ms 500 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "a client without the keys was answered: $out"
kill "$server_pid"; wait "$server_pid"; server_pid=""
echo "replay_server_test: all checks passed"
