#!/usr/bin/env bash
# Fleet launch end to end with real processes: the dry-run plan, bad configs failing in one line,
# a supervised fleet of echo actors whose heartbeats carry their progress counters, surviving the
# SIGKILL of one of them (noticed, restarted with a new pid, the other untouched), `orrery fleet status`, clean shutdown on SIGINT with no process
# left behind, and the shape of the Slurm rendering.
set -uo pipefail
orrery="$1"
tmp="$(mktemp -d)"
launch_pid=""
cleanup() {
  if [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2>/dev/null; then kill -KILL "$launch_pid"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/launch.log" ] && tail -30 "$tmp/launch.log"; exit 1; }

write_config() {  # write_config FILE FLEET_BODY
  printf '[run]\nname = "fleet-test"\ndir = "%s/run"\n\n[fleet]\n%s\n' "$tmp" "$2" > "$1"
}
one_line_error() {  # one_line_error NAME EXPECTED_SUBSTRING -- ARGS...
  local name="$1" want="$2"; shift 3
  local out rc
  out="$("$orrery" "$@" 2>&1)"; rc=$?
  [ $rc -ne 0 ] || fail "$name: exited 0"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "$name: more than one line: $out"
  case "$out" in *"$want"*) ;; *) fail "$name: expected '$want' in: $out" ;; esac
}

# --- bad configs: one clear line, non-zero exit ---------------------------------------------
write_config "$tmp/zero.toml" $'[[fleet.roles]]\nrole = "echo"\ncount = 0'
one_line_error zero "the fleet has no actors" -- launch "$tmp/zero.toml"
write_config "$tmp/unknown.toml" $'[[fleet.roles]]\nrole = "nosuchrole"'
one_line_error unknown-role "unknown role 'nosuchrole'" -- launch "$tmp/unknown.toml"
write_config "$tmp/typo.toml" $'heartbeat = 5\n[[fleet.roles]]\nrole = "echo"'
one_line_error unknown-key "unknown key 'fleet.heartbeat'" -- launch "$tmp/typo.toml"
write_config "$tmp/progress.toml" $'heartbeat_ms = 500\nprogress_timeout_ms = 600\n[[fleet.roles]]\nrole = "echo"'
one_line_error progress-timeout "fleet.progress_timeout_ms" -- launch "$tmp/progress.toml"
one_line_error actor-progress-timeout "--progress-timeout-ms: expected 0 (off) or more, got -1" \
  -- actor echo --endpoint "ipc://$tmp/echo.sock" --progress-timeout-ms -1
python3 -c 'import socket,sys,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(60)' > "$tmp/port" &
holder=$!
for _ in $(seq 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port="$(cat "$tmp/port")"
write_config "$tmp/inuse.toml" "transport = \"tcp\"
coordinator = \"ipc://$tmp/c.sock\"
[[fleet.roles]]
role = \"echo\"
port = $port"
one_line_error port-in-use "port $port of tcp://127.0.0.1:$port is already in use" -- launch "$tmp/inuse.toml"
kill "$holder"
write_config "$tmp/far.toml" $'transport = "tcp"\nhost = "192.0.2.7"\n[[fleet.roles]]\nrole = "echo"'
one_line_error unreachable "is not an address of this machine" -- launch "$tmp/far.toml"
write_config "$tmp/ipc.toml" $'[[fleet.roles]]\nrole = "echo"'
one_line_error emit-needs-tcp "needs \"tcp\"" -- launch "$tmp/ipc.toml" --emit slurm

# --- dry run ----------------------------------------------------------------------------------
write_config "$tmp/fleet.toml" $'heartbeat_ms = 100\nheartbeat_timeout_ms = 3000\nrestart_backoff_ms = 100\nshutdown_grace_ms = 3000\n[[fleet.roles]]\nrole = "echo"\ncount = 2'
plan="$("$orrery" launch "$tmp/fleet.toml" --dry-run)" || fail "dry run failed"
printf '%s\n' "$plan" | grep -q "^2 actor processes" || fail "dry run: $plan"
printf '%s\n' "$plan" | grep -q "echo:1 .*ipc://$tmp/run/fleet/echo-1.sock .*actor echo --index 1" \
  || fail "dry run lacks echo:1: $plan"

# --- a supervised fleet survives SIGKILL and stops cleanly on SIGINT ---------------------------
"$orrery" launch "$tmp/fleet.toml" > "$tmp/launch.log" 2>&1 &
launch_pid=$!
status() { "$orrery" fleet status --config "$tmp/fleet.toml" --timeout-ms 1000 2>/dev/null; }
field() { status | awk -v n="$1" -v f="$2" '$1 == n { print $f }'; }  # 3 state, 4 pid, 5 restarts,
# 8 progress ("never", or "1.2s" of "1.2s ago": when the role's progress counter last advanced)
wait_for() {  # wait_for SECONDS COMMAND...
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done
}
both_running() { [ "$(field echo:0 3)" = running ] && [ "$(field echo:1 3)" = running ]; }
wait_for 20 both_running || fail "the two echo actors never reached running: $(status)"
pid0="$(field echo:0 4)"; pid1="$(field echo:1 4)"
progressing() { [ "$(field echo:1 8)" != never ] && [ -n "$(field echo:1 8)" ]; }
wait_for 10 progressing || fail "echo:1's heartbeats carry no progress: $(status)"
kill -0 "$pid0" && kill -0 "$pid1" || fail "status pids are not live processes"
kill -KILL "$pid0"
restarted() { [ "$(field echo:0 3)" = running ] && [ "$(field echo:0 5)" = 1 ] && [ "$(field echo:0 4)" != "$pid0" ]; }
wait_for 10 restarted || fail "echo:0 was not restarted after SIGKILL: $(status)"
status | grep "^echo:0" | grep -q "killed by signal 9" || fail "last exit not reported: $(status)"
[ "$(field echo:1 4)" = "$pid1" ] && [ "$(field echo:1 5)" = 0 ] || fail "echo:1 was disturbed: $(status)"
new0="$(field echo:0 4)"
[ -s "$tmp/run/fleet_metrics.jsonl" ] || fail "no fleet metrics written"
# Per actor, under its own name, the dashboard's series: the restart is counted (in the next
# record the launcher writes after the restart, which may come after `fleet status` shows it).
restart_recorded() {
  grep '"source":"echo:0"' "$tmp/run/fleet_metrics.jsonl" | grep -q '"fleet/restarts_total":1'
}
wait_for 10 restart_recorded ||
  fail "no per-actor metrics with the restart: $(tail -3 "$tmp/run/fleet_metrics.jsonl")"

kill -INT "$launch_pid"
stopped() { ! kill -0 "$launch_pid" 2>/dev/null; }
wait_for 10 stopped || fail "launch did not stop within 10 s of SIGINT"
wait "$launch_pid"; rc=$?
launch_pid=""
[ $rc -eq 0 ] || fail "launch exited $rc after SIGINT"
for p in "$pid1" "$new0"; do
  ! kill -0 "$p" 2>/dev/null || fail "actor pid $p outlived the fleet"
done
! pgrep -f "$tmp/run" > /dev/null || fail "processes left behind: $(pgrep -af "$tmp/run")"

# --- cluster launch files ---------------------------------------------------------------------
write_config "$tmp/cluster.toml" $'transport = "tcp"\nbase_port = 6100\n[[fleet.roles]]\nrole = "echo"\ncount = 3\ncpus = 2\ngpus = 1'
slurm="$("$orrery" launch "$tmp/cluster.toml" --emit slurm)" || fail "emit slurm"
printf '%s\n' "$slurm" | grep -q "^#SBATCH --ntasks=3" || fail "slurm: ntasks: $slurm"
printf '%s\n' "$slurm" | grep -q "^#SBATCH --cpus-per-task=2" || fail "slurm: cpus: $slurm"
printf '%s\n' "$slurm" | grep -q "^srun --exact --ntasks=3 --cpus-per-task=2 .*--gpus-per-task=1" || fail "slurm: srun: $slurm"
printf '%s\n' "$slurm" | grep -q -- "launch \"\$CONFIG\" --external" || fail "slurm: coordinator: $slurm"
printf '%s\n' "$slurm" | grep -q -- "--progress-timeout-ms 120000" || fail "slurm: no progress watchdog: $slurm"
bash -n <(printf '%s\n' "$slurm") || fail "slurm script is not valid bash"
# The scripts run on a Slurm cluster in slurm_test.sh; kubectl checks the manifests in k8s_test.sh.
echo "fleet_test: all checks passed"
