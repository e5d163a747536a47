#!/usr/bin/env bash
# Issue 7's scenario: `orrery launch` with a replay store and two environment workers. The SIGKILL
# of each is noticed and the actor restarted; an acknowledged replay item survives (same database
# and endpoint), a restarted env worker serves episodes again, the actors not killed are
# untouched, and Ctrl-C leaves no process behind.
set -uo pipefail
orrery="$1"
probe="$2"      # replay_client_probe: inserts one acknowledged item into table "t"
env_probe="$3"  # env_serve_probe: runs calc episodes against an env worker
tmp="$(mktemp -d)"
launch_pid=""
cleanup() {
  if [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2>/dev/null; then kill -KILL "$launch_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/launch.log" ] && tail -30 "$tmp/launch.log"; exit 1; }

cat > "$tmp/fleet.toml" <<TOML
[run]
name = "fleet-replay-env"
dir = "$tmp/run"

[replay]
[[replay.tables]]
name = "t"
max_size = 100
max_item_bytes = 1000000

[fleet]
heartbeat_ms = 100
heartbeat_timeout_ms = 3000
restart_backoff_ms = 100
shutdown_grace_ms = 5000

[[fleet.roles]]
role = "replay"

[[fleet.roles]]
role = "env"
count = 2

[env]
name = "calc"
[env.calc]
seed = 3
difficulty = 2
TOML
"$orrery" launch "$tmp/fleet.toml" > "$tmp/launch.log" 2>&1 &
launch_pid=$!
status() { "$orrery" fleet status --config "$tmp/fleet.toml" --timeout-ms 1000 2>/dev/null; }
field() { status | awk -v n="$1" -v f="$2" '$1 == n { print $f }'; }  # 3 state, 4 pid, 5 restarts
wait_for() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done
}
running() {
  [ "$(field replay:0 3)" = running ] && [ "$(field env:0 3)" = running ] &&
    [ "$(field env:1 3)" = running ]
}
wait_for 30 running || fail "the fleet never reached running: $(status)"
endpoint="ipc://$tmp/run/fleet/replay-0.sock"
"$probe" "$endpoint" > "$tmp/probe.log" 2>&1 || fail "probe against the fleet's store: $(cat "$tmp/probe.log")"
size() { "$orrery" replay info --connect "$endpoint" --timeout-ms 1000 2>/dev/null | awk '$1 == "t:" { split($3, a, "/"); print a[1] }'; }
before="$(size)"
[ -n "$before" ] && [ "$before" -ge 1 ] || fail "no acknowledged item in the store: $("$orrery" replay info --connect "$endpoint")"

pid="$(field replay:0 4)"; env0_pid="$(field env:0 4)"; env1_pid="$(field env:1 4)"
kill -KILL "$pid"
restarted() { [ "$(field replay:0 3)" = running ] && [ "$(field replay:0 5)" = 1 ]; }
wait_for 20 restarted || fail "replay:0 was not restarted: $(status)"
after=""
for _ in $(seq 50); do after="$(size)"; [ -n "$after" ] && break; sleep 0.1; done
[ "$after" = "$before" ] || fail "the store came back with $after items, $before were acknowledged"
[ "$(field env:0 4)" = "$env0_pid" ] || fail "env:0 was disturbed: $(status)"
[ "$(field env:1 4)" = "$env1_pid" ] || fail "env:1 was disturbed: $(status)"

# Each env worker: SIGKILL, restart, and episodes served again at the same endpoint.
replay_pid="$(field replay:0 4)"
for i in 0 1; do
  other=$((1 - i)); other_pid="$(field env:$other 4)"
  ep="ipc://$tmp/run/fleet/env-$i.sock"
  out="$(timeout 30 "$env_probe" "$ep" episodes 3 2>&1)" || fail "env:$i before the kill: $out"
  kill -KILL "$(field env:$i 4)"
  env_restarted() { [ "$(field env:$i 3)" = running ] && [ "$(field env:$i 5)" = 1 ]; }
  wait_for 20 env_restarted || fail "env:$i was not restarted: $(status)"
  out="$(timeout 30 "$env_probe" "$ep" episodes 3 2>&1)" || fail "env:$i after its restart: $out"
  [ "$(field env:$other 4)" = "$other_pid" ] || fail "env:$other was disturbed: $(status)"
  [ "$(field replay:0 4)" = "$replay_pid" ] || fail "replay:0 was disturbed: $(status)"
done

kill -INT "$launch_pid"
stopped() { ! kill -0 "$launch_pid" 2>/dev/null; }
wait_for 15 stopped || fail "launch did not stop"
wait "$launch_pid"; rc=$?; launch_pid=""
[ $rc -eq 0 ] || fail "launch exited $rc"
! pgrep -f "$tmp/run" > /dev/null || fail "processes left behind: $(pgrep -af "$tmp/run")"
echo "fleet_replay_env_test: all checks passed"
