#!/usr/bin/env bash
# The Slurm launch for real: a one-node Slurm cluster on this machine (munged with a fresh key,
# slurmctld and slurmd in the foreground from a minimal slurm.conf in a temporary directory), and
# the batch scripts `orrery launch CONFIG --emit slurm` renders, submitted with sbatch:
#   1. a tiny RL run (the coordinator pretrains and scores in the batch step; replay, rollout and
#      learner steps): its rollout actor is SIGKILLed mid-run and restarted within
#      fleet.restart_budget = 1, and the job completes with the run summary;
#   2. an echo fleet whose actor is SIGKILLed twice with restart_budget = 1: the second death
#      spends the budget, and the job ends non-zero.
# Without root or Slurm's daemons, or when they cannot start here, it prints one line saying why
# and exits 77 (ctest: skipped).
# usage: slurm_test.sh ORRERY_BINARY
set -uo pipefail
orrery="$1"
skip() { echo "SKIP: $*"; exit 77; }
for c in munged slurmctld slurmd sbatch squeue scontrol scancel; do
  command -v "$c" >/dev/null 2>&1 || skip "no $c (scripts/setup.sh installs slurm-wlm and munge)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start job steps"

tmp="$(mktemp -d)"
chmod 755 "$tmp"
daemons=()
cleanup() {
  # Jobs first (their steps run under slurmstepd, not under this script), then the daemons.
  if [ ${#daemons[@]} -gt 0 ]; then
    scancel --quiet --user=root 2>/dev/null
    for _ in $(seq 1 30); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.5; done
    for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do kill "${daemons[$i]}" 2>/dev/null; done
    for p in "${daemons[@]}"; do wait "$p" 2>/dev/null; done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.out "$tmp"/log/*.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -40 "$f" >&2; }
  done
  exit 1
}
wait_for() {  # wait_for SECONDS COMMAND...: polls COMMAND until it succeeds; a bound, not a timing
  local end=$((SECONDS + $1))
  shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done
}
free_ports() {  # free_ports N: a base port whose next N-1 ports are free too
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randint(20000, 60000 - n)
    try:
        socks = []
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("0.0.0.0", p))
            socks.append(s)
        print(base)
        sys.exit(0)
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
sys.exit("no free ports")
PY
}

# --- the cluster --------------------------------------------------------------------------------
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log"
chmod 711 "$tmp/munge"
head -c 1024 /dev/urandom >"$tmp/munge/munge.key"
chmod 400 "$tmp/munge/munge.key"
munged -F --force --socket="$tmp/munge/munge.sock" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
  --log-file="$tmp/log/munged.log" >"$tmp/log/munged.log" 2>&1 &
daemons+=($!)
wait_for 10 test -S "$tmp/munge/munge.sock" || skip "munged did not start: $(tail -1 "$tmp/log/munged.log")"

host="$(hostname -s)"
ports="$(free_ports 2)" || skip "no free ports for slurmctld and slurmd"
# One node with this machine's name and memory. It declares at least 4 CPUs (config_overrides:
# slurmd does not check them against the hardware) so that the fleets' steps, one CPU each, run
# together on a 2-core CI machine. No cgroups: processes are tracked through /proc.
cpus=$(($(nproc) > 4 ? $(nproc) : 4))
mem_mb=$(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo)
cat >"$tmp/slurm.conf" <<EOF
ClusterName=orrery-test
SlurmctldHost=$host
SlurmctldPort=$ports
SlurmdPort=$((ports + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/munge.sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$tmp/slurm.conf"
slurmctld -D -f "$SLURM_CONF" >"$tmp/log/slurmctld.log" 2>&1 &
daemons+=($!)
slurmd -D -f "$SLURM_CONF" -N "$host" >"$tmp/log/slurmd.log" 2>&1 &
daemons+=($!)
node_idle() { [ "$(sinfo -h -n "$host" -o %t 2>/dev/null)" = idle ]; }
if ! wait_for 30 node_idle; then
  for p in "${daemons[@]:1}"; do
    kill -0 "$p" 2>/dev/null || skip "a Slurm daemon cannot start here: $(grep -h error "$tmp"/log/slurm*.log | tail -1)"
  done
  fail "the node did not become idle: $(sinfo 2>&1)"
fi

# submit SCRIPT: prints the job id.
submit() { sbatch --parsable --output="$tmp/job-%j.out" "$1" | cut -d';' -f1; }
job_field() { scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
job_over() { case "$(job_field "$1" JobState)" in PENDING | CONFIGURING | RUNNING | COMPLETING) return 1 ;; esac; }
# pid_of ROLE INDEX CONFIG: the actor process (not its restart loop).
pid_of() { pgrep -f -- "actor $1 --index $2 .*--config $3 " | head -1; }
# gone CONFIG: no process of the job (coordinator, actors) is left once it has ended.
gone() { ! pgrep -f -- "$1" >/dev/null; }

# --- 1. a tiny RL run; its rollout actor killed once, within the budget ------------------------
source "$(dirname "$0")/rl_corpus.sh"
make_rl_corpus "$orrery" "$tmp" 200 256 || fail "no corpus"
base="$(free_ports 4)" || fail "no free ports for the RL fleet"
cat >"$tmp/rl.toml" <<EOF
[run]
name = "slurm-rl"
dir = "$tmp/rl"
seed = 5
threads = 1
[pretrain]
model = "model.toml"
data = "data"
tokens_per_step = 512
micro_batch_tokens = 512
eval_every = 2
eval_tokens = 256
checkpoint_every = 2
keep_checkpoints = 1
[optimizer]
lr = 3e-3
warmup_steps = 1
[[stages]]
name = "s128"
seq_len = 128
tokens = 1024
[env]
name = "calc"
[env.calc]
seed = 4
difficulty = 1
[replay]
path = "$tmp/rl/replay/db"
checkpoint_dir = "$tmp/rl/replay/checkpoints"
[[replay.tables]]
name = "trajectories"
preset = "queue"
max_size = 8
max_staleness = 2
[rl]
steps = 100                   # long enough (seconds) that the kill lands mid-run
groups_per_step = 2
group_size = 2
checkpoint_every = 50
keep_checkpoints = 1
eval_tasks = 2
gloo_timeout_ms = 8000
[rl.rollout]
slots = 4
max_turns = 2
max_turn_tokens = 16
max_episode_tokens = 200
[rl.learner]
lr = 1e-3
max_staleness = 2
skip_uniform_groups = false
micro_batch_tokens = 512
[fleet]
transport = "tcp"
base_port = $base
heartbeat_ms = 200
heartbeat_timeout_ms = 5000
restart_backoff_ms = 100
restart_backoff_max_ms = 1000
restart_budget = 1
shutdown_grace_ms = 3000
[[fleet.roles]]
role = "replay"
memory_gb = 0.5
[[fleet.roles]]
role = "rollout"
memory_gb = 0.5
[[fleet.roles]]
role = "learner"
memory_gb = 0.5
[fleet.slurm]
time = "00:10:00"
orrery = "$orrery"
EOF
"$orrery" launch "$tmp/rl.toml" --emit slurm >"$tmp/rl.sbatch" || fail "emit slurm"
job="$(submit "$tmp/rl.sbatch")" || fail "sbatch refused the RL script"
published() {  # a policy version >= 1 (or the job over)
  local f
  for f in "$tmp"/rl/rl/weights/v-*.safetensors; do
    [ -e "$f" ] && [ "$((10#$(basename "$f" .safetensors | sed 's/^v-//')))" -ge 1 ] && return 0
  done
  job_over "$job"
}
wait_for 150 published || fail "no policy version 1 within 150 s"
job_over "$job" && fail "the RL job ended before its rollout could be killed"
pid="$(pid_of rollout 0 "$tmp/rl.toml")"
[ -n "$pid" ] || fail "no rollout:0 process"
kill -KILL "$pid"
wait_for 150 job_over "$job" || fail "the RL job did not end within 150 s"
out="$tmp/job-$job.out"
[ "$(job_field "$job" JobState)" = COMPLETED ] && [ "$(job_field "$job" ExitCode)" = 0:0 ] ||
  fail "RL job: $(job_field "$job" JobState) $(job_field "$job" ExitCode)"
grep -q "orrery-slurm: rollout:0 ended (killed by signal 9); restarting in 100 ms (restart 1 of 1" "$out" ||
  fail "the killed rollout was not restarted"
[ "$(grep -c "\[rollout:0\] started (pid" "$out")" -ge 2 ] || fail "no second rollout:0 process started"
grep -qE "pass rate +before .* -> after " "$out" || fail "no run summary"
[ -d "$tmp/rl/rl/checkpoints/step-00000100" ] || fail "no final RL checkpoint"
wait_for 10 gone "$tmp/rl.toml" || fail "processes outlived the RL job: $(pgrep -af -- "$tmp/rl.toml")"

# --- 2. an echo fleet: two deaths of one instance spend restart_budget = 1 ---------------------
base="$(free_ports 2)" || fail "no free ports for the echo fleet"
cat >"$tmp/echo.toml" <<EOF
[run]
name = "slurm-echo"
dir = "$tmp/echo"
[fleet]
transport = "tcp"
base_port = $base
heartbeat_ms = 200
restart_backoff_ms = 100
restart_budget = 1
shutdown_grace_ms = 2000
[[fleet.roles]]
role = "echo"
memory_gb = 0.25
[fleet.slurm]
time = "00:05:00"
orrery = "$orrery"
EOF
"$orrery" launch "$tmp/echo.toml" --emit slurm >"$tmp/echo.sbatch" || fail "emit slurm (echo)"
job="$(submit "$tmp/echo.sbatch")" || fail "sbatch refused the echo script"
out="$tmp/job-$job.out"
echo_up() { [ -n "$(pid_of echo 0 "$tmp/echo.toml")" ] || job_over "$job"; }
wait_for 60 echo_up || fail "no echo:0 process within 60 s"
first="$(pid_of echo 0 "$tmp/echo.toml")"
[ -n "$first" ] || fail "the echo job ended before its actor ran"
kill -KILL "$first"
restarted() { p="$(pid_of echo 0 "$tmp/echo.toml")"; [ -n "$p" ] && [ "$p" != "$first" ] || job_over "$job"; }
wait_for 30 restarted || fail "echo:0 was not restarted"
second="$(pid_of echo 0 "$tmp/echo.toml")"
[ -n "$second" ] || fail "the echo job ended after one death, within its budget"
kill -KILL "$second"
wait_for 60 job_over "$job" || fail "the echo job did not end after its budget was spent"
[ "$(job_field "$job" JobState)" = FAILED ] || fail "echo job: $(job_field "$job" JobState)"
[ "$(job_field "$job" ExitCode)" != 0:0 ] || fail "echo job exited 0"
grep -q "orrery-slurm: echo:0 was restarted 1 times within 300 s (fleet.restart_budget) and ended again (killed by signal 9)" "$out" ||
  fail "no budget message"
grep -q "orrery-slurm: role echo failed" "$out" || fail "the batch script did not report the failed role"
wait_for 10 gone "$tmp/echo.toml" || fail "processes outlived the echo job: $(pgrep -af -- "$tmp/echo.toml")"
echo "slurm_test: all checks passed"
