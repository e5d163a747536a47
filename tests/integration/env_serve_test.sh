#!/usr/bin/env bash
# `orrery env serve` as a real process: bad configs fail with one line; a client process runs
# full calc episodes over tcp loopback; the server is SIGKILLed while the client holds an open
# episode, restarted on the same port, and the client gets "episode lost", re-issues the task and
# finishes it. Bounded: every wait has a limit.
set -uo pipefail
orrery="$1"
probe="$2"
tmp="$(mktemp -d)"
server_pid=""
probe_pid=""
cleanup() {
  for p in $server_pid $probe_pid; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }

one_line_error() {  # one_line_error NAME EXPECTED_SUBSTRING -- ARGS...
  local name="$1" want="$2"; shift 3
  local out rc
  out="$(timeout 20 "$orrery" "$@" 2>&1)"; rc=$?
  [ $rc -ne 0 ] || fail "$name: exited 0"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "$name: more than one line: $out"
  case "$out" in *"$want"*) ;; *) fail "$name: expected '$want' in: $out" ;; esac
}

# --- bad input: one line, non-zero ----------------------------------------------------------
printf '[env]\nname = "nosuch"\n' > "$tmp/unknown.toml"
one_line_error unknown-env "nosuch" -- env serve --config "$tmp/unknown.toml" --listen tcp://127.0.0.1:0
printf '[env]\nname = "calc"\n[env_server]\nworkers = 0\n' > "$tmp/workers.toml"
one_line_error zero-workers "env_server.workers" -- env serve --config "$tmp/workers.toml"
printf '[env]\nname = "calc"\n[env_server]\nworkerz = 4\n' > "$tmp/typo.toml"
one_line_error typo "env_server.workerz" -- env serve --config "$tmp/typo.toml"
one_line_error missing-file "$tmp/none.toml" -- env serve --config "$tmp/none.toml"
printf '[env]\nname = "calc"\n' > "$tmp/ok.toml"
one_line_error bad-endpoint "cannot bind" -- env serve --config "$tmp/ok.toml" --listen "nonsense://x"
one_line_error plain-beyond-loopback "needs --curve-key-dir" -- env serve --config "$tmp/ok.toml" \
  --listen "tcp://*:0"

# --- serve, run episodes ----------------------------------------------------------------------
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
endpoint="tcp://127.0.0.1:$port"
printf '[env]\nname = "calc"\n[env.calc]\nseed = 3\ndifficulty = 2\n[env_server]\nworkers = 4\n' \
  > "$tmp/serve.toml"
start_server() {
  "$orrery" env serve --config "$tmp/serve.toml" --listen "$endpoint" >> "$tmp/server.log" 2>&1 &
  server_pid=$!
  local end=$((SECONDS + 20)) want="$1"
  until [ "$(grep -c '^env: serving calc on' "$tmp/server.log")" -ge "$want" ]; do
    kill -0 "$server_pid" 2>/dev/null || fail "the server exited"
    [ $SECONDS -lt $end ] || fail "the server did not start"
    sleep 0.1
  done
}
start_server 1
out="$(timeout 30 "$probe" "$endpoint" episodes 20 2>&1)" || fail "episodes: $out"
[ "$out" = "ok 20" ] || fail "episodes: $out"

# --- SIGKILL with an open episode, restart, the client re-issues -----------------------------
timeout 40 "$probe" "$endpoint" survive > "$tmp/probe.log" 2>&1 &
probe_pid=$!
end=$((SECONDS + 20))
until grep -q '^opened' "$tmp/probe.log"; do
  [ $SECONDS -lt $end ] || fail "the probe never opened an episode"
  sleep 0.1
done
sleep 0.3
kill -KILL "$server_pid"
wait "$server_pid" 2>/dev/null
sleep 0.5  # the client sees the server down for a while
start_server 2
wait "$probe_pid"; rc=$?
probe_pid=""
[ $rc -eq 0 ] || fail "the probe did not recover (rc $rc)"
grep -q '^recovered' "$tmp/probe.log" || fail "no recovery line"

# --- SIGTERM stops the server cleanly ------------------------------------------------------------
kill -TERM "$server_pid"
end=$((SECONDS + 10))
while kill -0 "$server_pid" 2>/dev/null; do
  [ $SECONDS -lt $end ] || fail "the server ignored SIGTERM"
  sleep 0.1
done
wait "$server_pid"; rc=$?
server_pid=""
[ $rc -eq 0 ] || fail "the server exited $rc on SIGTERM"
echo "env serve: OK"
