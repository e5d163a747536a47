#!/usr/bin/env bash
# The main job in miniature, with real processes: `orrery launch` pretrains a very small hybrid
# model, scores it, runs the RL fleet (replay store, 2 rollout actors, 2 learner ranks over Gloo)
# to its last policy version and prints the summary; the same job with the rollouts' environment
# on two env workers of the fleet (env = "remote") and their weights fetched from the learner. Then the same run with faults: a rollout
# actor and a learner rank are SIGKILLed mid-run; the supervisor restarts them, the rollout
# re-issues its unacknowledged groups, the learner ranks resume together from the last checkpoint
# (re-using the batch the dead rank had logged), and the run still ends with its summary.
# usage: rl_launch_test.sh ORRERY_BINARY
set -euo pipefail
orrery="$1"
tmp="$(mktemp -d)"
launch_pid=""
cleanup() {
  if [ -n "$launch_pid" ]; then kill "$launch_pid" 2>/dev/null || true; wait "$launch_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -40 "$f" >&2; }; done
  exit 1
}

# --- data: calculator transcripts (difficulty 1), a little plain text, the tiny model.
source "$(dirname "$0")/rl_corpus.sh"
make_rl_corpus "$orrery" "$tmp" 300 512

# write_config FILE RUN_DIR STEPS [remote]: with "remote", the rollouts' environment calls go to
# two env workers of the fleet ([rl.rollout] env = "remote") and their weights come from learner
# rank 0 over the fleet's transport (weights = "learner"), not from RUN/rl/weights.
write_config() {
  local env_mode="local" env_roles="" weights="directory"
  if [ "${4:-}" = remote ]; then
    env_mode="remote"
    weights="learner"
    env_roles=$'[[fleet.roles]]\nrole = "env"\ncount = 2'
  fi
  cat >"$1" <<EOF
[run]
name = "rl-test"
dir = "$2"
seed = 5
threads = 1
[pretrain]
model = "model.toml"
data = "data"
tokens_per_step = 1024
micro_batch_tokens = 512
eval_every = 2
eval_tokens = 512
checkpoint_every = 2
keep_checkpoints = 1
[optimizer]
lr = 3e-3
warmup_steps = 1
[[stages]]
name = "s256"
seq_len = 256
tokens = 4096
[env]
name = "calc"
[env.calc]
seed = 4
difficulty = 1
[replay]
path = "$2/replay/db"
checkpoint_dir = "$2/replay/checkpoints"
[[replay.tables]]
name = "trajectories"
preset = "queue"
max_size = 8
max_staleness = 4
[rl]
steps = $3
groups_per_step = 4
group_size = 4
checkpoint_every = 2
keep_checkpoints = 2
eval_tasks = 6
gloo_timeout_ms = 8000
[rl.rollout]
slots = 8
max_turns = 2
max_turn_tokens = 24
max_episode_tokens = 240
env = "$env_mode"
weights = "$weights"
[rl.learner]
lr = 1e-3
skip_uniform_groups = false   # a barely trained model rarely passes: train on every group
micro_batch_tokens = 1024
[fleet]
transport = "ipc"
heartbeat_ms = 200
heartbeat_timeout_ms = 5000
restart_backoff_ms = 100
restart_backoff_max_ms = 1000
restart_budget = 6
shutdown_grace_ms = 3000
metrics_endpoint = "ipc://$2/fleet/metrics.sock"
dashboard = true
[[fleet.roles]]
role = "replay"
[[fleet.roles]]
role = "rollout"
count = 2
[[fleet.roles]]
role = "learner"
count = 2
$env_roles
EOF
}

# --- 1. the whole job.
write_config "$tmp/rl.toml" "$tmp/run1" 8
timeout 240 "$orrery" launch "$tmp/rl.toml" >"$tmp/run1.log" 2>&1 || fail "launch exited $?"
grep -q "pretrain summary: finished" "$tmp/run1.log" || fail "no pretraining summary"
grep -q "dashboard: http://127.0.0.1:" "$tmp/run1.log" || fail "no dashboard address"
grep -qE "pass rate +before [0-9.]+% \([0-9]+/6\) -> after [0-9.]+% \([0-9]+/6\)" "$tmp/run1.log" ||
  fail "no pass-rate summary"
[ -d "$tmp/run1/rl/checkpoints/step-00000008" ] || fail "no final RL checkpoint"
grep -q '"learner/loss"' "$tmp/run1/learner-0/metrics.jsonl" || fail "no learner metrics"
grep -q '"reward/pass_rate"' "$tmp/run1/rollout-1/metrics.jsonl" || fail "no rollout metrics"
grep -q "rank 1/2 at version 0" "$tmp/run1.log" || fail "the second learner rank did not run"
# Both rollout actors inserted groups, and the RL checkpoint generates on its own.
for i in 0 1; do [ -s "$tmp/run1/actors/rollout-$i/task_cursor" ] || fail "rollout-$i acknowledged nothing"; done
"$orrery" generate --checkpoint "$tmp/run1/rl/checkpoints" --prompt "What is 2 + 3?" \
  --max-tokens 8 >/dev/null || fail "generate from the RL checkpoint"

# --- 2. the same job with the environment on the fleet's env workers (RemoteEnv).
write_config "$tmp/remote.toml" "$tmp/run3" 4 remote
timeout 240 "$orrery" launch "$tmp/remote.toml" >"$tmp/run3.log" 2>&1 || fail "remote-env launch exited $?"
grep -q "environment 'calc' on env servers ipc://.*env-0.sock, ipc://.*env-1.sock" "$tmp/run3.log" ||
  fail "the rollouts did not use the env workers"
grep -qE "pass rate +before .* -> after " "$tmp/run3.log" || fail "no summary with remote envs"
[ -d "$tmp/run3/rl/checkpoints/step-00000004" ] || fail "the remote-env run did not finish"
grep -q '"rollout/env_lost_total":0' "$tmp/run3/rollout-0/metrics.jsonl" ||
  fail "no environment-fault counters in the rollout metrics"
grep -q "rollout:0.*weights: following learner:0 at ipc://" "$tmp/run3.log" ||
  fail "rollout:0 did not follow the learner's weights"
grep -qE "rollout:1.*weights: version [1-4] from ipc://" "$tmp/run3.log" ||
  fail "rollout:1 fetched no version from the learner"
ls "$tmp"/run3/actors/rollout-0/weights/v-*.safetensors >/dev/null 2>&1 ||
  fail "no fetched version in rollout-0's own weight directory"
grep -q '"rollout/weight_fetch_bytes"' "$tmp/run3/rollout-0/metrics.jsonl" ||
  fail "no weight-fetch metrics"
# The fetch of version 0, made while the rollout starts, is reported too (it was lost when the
# rollout loaded it before its metrics publisher was open, and the test then depended on a later
# poll landing before the fleet stopped).
grep '"rollout/weight_fetch_bytes"' "$tmp/run3/rollout-0/metrics.jsonl" | grep -q '"step":0,' ||
  fail "the fetch of version 0 is not in rollout-0's metrics"

# --- 3. faults: SIGKILL a rollout actor, then a learner rank.
pid_of() { pgrep -f -- "actor $1 --index $2 .*$tmp/faults.toml" | head -1; }
wait_version() {  # wait_version V: a published policy version >= V
  for _ in $(seq 1 600); do
    for f in "$tmp"/run2/rl/weights/v-*.safetensors; do
      [ -e "$f" ] || continue
      v=$((10#$(basename "$f" .safetensors | sed 's/^v-//')))
      [ "$v" -ge "$1" ] && return 0
    done
    kill -0 "$launch_pid" 2>/dev/null || fail "launch ended before version $1"
    sleep 0.1
  done
  fail "version $1 was not published in time"
}
# Enough versions that the kills and the live checks happen well before the end.
write_config "$tmp/faults.toml" "$tmp/run2" 200
timeout 300 "$orrery" launch "$tmp/faults.toml" >"$tmp/run2.log" 2>&1 &
launch_pid=$!
wait_version 2
pid="$(pid_of rollout 0)"
[ -n "$pid" ] || fail "no rollout:0 process"
kill -9 "$pid"
wait_version 3
pid="$(pid_of learner 1)"
[ -n "$pid" ] || fail "no learner:1 process"
kill -9 "$pid"
# The launcher's metrics hub serves the live run; Prometheus accepts its /metrics.
url="$(grep -o "dashboard: http://[0-9.:]*/" "$tmp/run2.log" | head -1 | cut -d' ' -f2)"
[ -n "$url" ] || fail "no dashboard address printed"
# The fleet's records reach the hub once per metrics interval over PUB/SUB (the first ones can
# go before the subscription has propagated), so the series may lag the run's first versions:
# scrape until they are there, as Prometheus would, for at most 10 s.
fleet_series=""
for _ in $(seq 1 50); do
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "${url}metrics" >"$tmp/metrics.txt" || fail "no /metrics from the live hub at $url"
  if grep -q '^orrery_fleet_state{' "$tmp/metrics.txt"; then fleet_series=1; break; fi
  kill -0 "$launch_pid" 2>/dev/null || break
  sleep 0.2
done
[ -n "$fleet_series" ] || fail "no fleet series in the live /metrics within 10 s"
promtool check metrics <"$tmp/metrics.txt" >"$tmp/promtool.txt" 2>&1 ||
  fail "promtool rejects the live /metrics: $(cat "$tmp/promtool.txt")"
if ! wait "$launch_pid"; then launch_pid=""; fail "launch with faults exited non-zero"; fi
launch_pid=""
grep -q "rollout:0 ended (killed by signal 9" "$tmp/run2.log" ||
  fail "the rollout actor's death was not noticed"
grep -q "learner:1 ended" "$tmp/run2.log" || fail "the learner rank's death was not noticed"
grep -q "restored .*rl/checkpoints/step-" "$tmp/run2.log" || fail "the learner ranks did not resume from a checkpoint"
[ -d "$tmp/run2/rl/checkpoints/step-00000200" ] || fail "the run with faults did not finish"
grep -qE "pass rate +before .* -> after " "$tmp/run2.log" || fail "no summary after faults"
echo "rl launch: ok"
