#!/usr/bin/env bash
# A fleet on tcp authenticated with CURVE (issue 28): `orrery launch` generates the fleet's keys
# into <run.dir>/curve (secret key 0600); the coordinator, two echo actors and the replay store run
# and members talk (`orrery fleet status`, `orrery replay info` with the keys); strangers, plain or
# with a keypair of their own, get nothing from any endpoint and are counted in the fleet metrics;
# key files that are missing, garbled or readable by others fail in one line; the Slurm and
# Kubernetes renderings pass the keys on; Ctrl-C stops everything.
set -uo pipefail
orrery="$1"
probe="$2"  # curve_stranger_probe ENDPOINT [FLEET_PUB_FILE]
tmp="$(mktemp -d)"
launch_pid=""
cleanup() {
  if [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2>/dev/null; then kill -KILL "$launch_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/launch.log" ] && tail -30 "$tmp/launch.log"; exit 1; }
one_line_error() {  # one_line_error NAME EXPECTED_SUBSTRING -- ARGS...
  local name="$1" want="$2"; shift 3
  local out rc
  out="$("$orrery" "$@" 2>&1)"; rc=$?
  [ $rc -ne 0 ] || fail "$name: exited 0"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "$name: more than one line: $out"
  case "$out" in *"$want"*) ;; *) fail "$name: expected '$want' in: $out" ;; esac
}

# Four consecutive free ports: the coordinator, replay:0, echo:0, echo:1.
base="$(python3 -c 'import socket
for base in range(20000, 60000, 97):
    socks = []
    try:
        for p in range(base, base + 4):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks: s.close()
    print(base); break')"
[ -n "$base" ] || fail "no four free tcp ports"

write_config() {  # write_config FILE EXTRA_FLEET_LINES
  cat > "$1" <<TOML
[run]
name = "fleet-curve"
dir = "$tmp/run"

[replay]
[[replay.tables]]
name = "t"
max_size = 100
max_item_bytes = 1000000

[fleet]
transport = "tcp"
base_port = $base
heartbeat_ms = 100
heartbeat_timeout_ms = 3000
restart_backoff_ms = 100
shutdown_grace_ms = 5000
metrics_interval_ms = 200
$2

[[fleet.roles]]
role = "replay"

[[fleet.roles]]
role = "echo"
count = 2
TOML
}

# --- bad key files: one clear line naming the file, non-zero exit ------------------------------
write_config "$tmp/missing.toml" "curve_key_dir = \"$tmp/nokeys\""
one_line_error missing-keys "$tmp/nokeys/fleet.key: no such file" -- launch "$tmp/missing.toml"
mkdir -p "$tmp/open" && "$orrery" fleet keygen "$tmp/open" > /dev/null || fail "keygen"
chmod 644 "$tmp/open/fleet.key"
write_config "$tmp/open.toml" "curve_key_dir = \"$tmp/open\""
one_line_error open-key "$tmp/open/fleet.key: mode 0644" -- launch "$tmp/open.toml"
one_line_error open-key-actor "expected 0600" -- actor echo --endpoint "tcp://127.0.0.1:$base" \
  --curve-key-dir "$tmp/open"
chmod 600 "$tmp/open/fleet.key" && echo "garbage" > "$tmp/open/fleet.key"
one_line_error garbled-key "$tmp/open/fleet.key: expected a CURVE secret key" -- launch "$tmp/open.toml"
one_line_error actor-without-keys "needs its CURVE keys" -- actor echo --endpoint "tcp://127.0.0.1:$base"

# --- a fleet with generated keys ---------------------------------------------------------------
write_config "$tmp/fleet.toml" ""
"$orrery" launch "$tmp/fleet.toml" > "$tmp/launch.log" 2>&1 &
launch_pid=$!
keys="$tmp/run/curve"
status() { "$orrery" fleet status --config "$tmp/fleet.toml" --timeout-ms 1000 2>/dev/null; }
field() { status | awk -v n="$1" -v f="$2" '$1 == n { print $f }'; }
wait_for() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done
}
running() {
  [ "$(field replay:0 3)" = running ] && [ "$(field echo:0 3)" = running ] &&
    [ "$(field echo:1 3)" = running ]
}
wait_for 30 running || fail "the fleet never reached running: $(status)"
grep -q "generated the fleet's CURVE keys in $keys" "$tmp/launch.log" || fail "no keygen line"
[ "$(stat -c %a "$keys/fleet.key")" = 600 ] || fail "fleet.key is $(stat -c %a "$keys/fleet.key")"
[ "$(stat -c %a "$keys")" = 700 ] || fail "the key directory is $(stat -c %a "$keys")"
pgrep -af "actor echo" | grep -q -- "--curve-key-dir $keys" || fail "actors got no --curve-key-dir"

# Members: the replay store answers a client holding the keys.
"$orrery" replay info --connect "tcp://127.0.0.1:$((base + 1))" --curve-key-dir "$keys" \
  --timeout-ms 2000 | grep -q "^t:" || fail "replay info with the fleet's keys"

# Strangers: nothing from the coordinator, an actor or the store; each refusal is counted.
for port in "$base" "$((base + 1))" "$((base + 2))"; do
  out="$("$probe" "tcp://127.0.0.1:$port" "$keys/fleet.pub" 2>&1)" || fail "stranger: $out"
done
one_line_error status-without-keys "needs its CURVE keys" -- fleet status --connect "tcp://127.0.0.1:$base"
out="$("$orrery" replay info --connect "tcp://127.0.0.1:$((base + 1))" --timeout-ms 500 2>&1)" &&
  fail "replay info without keys was answered: $out"
counted() {
  tail -50 "$tmp/run/fleet_metrics.jsonl" | python3 -c 'import json, sys
total = actor = 0
for line in sys.stdin:
    r = json.loads(line)
    if r["source"] == "coordinator": total = r["metrics"]["fleet/auth_refused_total"]
    if r["source"] == "replay:0": actor = r["metrics"]["fleet/auth_refused"]
sys.exit(0 if total >= 3 and actor >= 1 else 1)'
}
wait_for 10 counted || fail "refusals not in the fleet metrics: $(tail -3 "$tmp/run/fleet_metrics.jsonl")"
grep -q "refused tcp peer 127.0.0.1: CURVE public key" "$tmp/launch.log" || fail "no refusal logged"
[ "$(field echo:0 5)" = 0 ] && [ "$(field replay:0 5)" = 0 ] || fail "an actor restarted: $(status)"

kill -INT "$launch_pid"
stopped() { ! kill -0 "$launch_pid" 2>/dev/null; }
wait_for 15 stopped || fail "launch did not stop"
wait "$launch_pid"; rc=$?; launch_pid=""
[ $rc -eq 0 ] || fail "launch exited $rc"
! pgrep -f "$tmp/run" > /dev/null || fail "processes left behind: $(pgrep -af "$tmp/run")"

# --- cluster renderings pass the keys on -------------------------------------------------------
slurm="$("$orrery" launch "$tmp/fleet.toml" --emit slurm)" || fail "emit slurm"
printf '%s\n' "$slurm" | grep -q "^export KEYS=$keys$" || fail "slurm: KEYS: $slurm"
printf '%s\n' "$slurm" | grep -q 'fleet keygen "$KEYS" || exit 1' || fail "slurm: keygen: $slurm"
printf '%s\n' "$slurm" | grep -q -- '--external .*--curve-key-dir "$KEYS"' || fail "slurm: coordinator keys"
printf '%s\n' "$slurm" | grep -q -- '--max-message-mb [0-9]* --curve-key-dir "$KEYS"' || fail "slurm: actor keys: $slurm"
printf '%s\n' "$slurm" | grep -q -- 'fleet status --connect "$COORDINATOR" --curve-key-dir "$KEYS"' ||
  fail "slurm: status keys: $slurm"
bash -n <(printf '%s\n' "$slurm") || fail "slurm script is not valid bash"
# Kubernetes keeps the run directory on its volume: a relative run.dir (it resolves there).
sed 's|^dir = .*|dir = "runs/fleet-curve"|' "$tmp/fleet.toml" >"$tmp/k8s.toml"
k8s="$("$orrery" launch "$tmp/k8s.toml" --emit k8s)" || fail "emit k8s"
printf '%s\n' "$k8s" | grep -q "secret: {secretName: fleet-curve-curve, defaultMode: 0400}" || fail "k8s: secret volume"
printf '%s\n' "$k8s" | grep -q "create secret generic fleet-curve-curve" || fail "k8s: how to make the secret"
# The coordinator, and each role's container and its wait for the coordinator.
[ "$(printf '%s\n' "$k8s" | grep -c -- "--curve-key-dir /etc/orrery-curve")" -eq 5 ] || fail "k8s: args"
echo "fleet_curve_test: all checks passed"
