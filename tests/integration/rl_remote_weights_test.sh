#!/usr/bin/env bash
# A rollout whose run directory is not the learner's ([rl.rollout] weights = "learner"): the run is
# launched as a cluster would (`orrery launch --external` pretrains, scores, then runs only the
# coordinator), its replay store and learner rank are started by hand on the learner's run
# directory, and its rollout actor on a second directory that holds only a copy of the initial
# policy, as on another host. Every policy version reaches the rollout over the fleet's transport
# (WeightServer -> WeightFetcher); the run ends with its summary; the learner's RUN/rl/weights is
# never read by the rollout (its directory has none), and its fetched copies are whole.
# usage: rl_remote_weights_test.sh ORRERY_BINARY
set -uo pipefail
orrery="$1"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -30 "$f" >&2; }; done
  exit 1
}
wait_for() {  # wait_for SECONDS COMMAND...: a bound, not a timing
  local end=$((SECONDS + $1))
  shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done
}

source "$(dirname "$0")/rl_corpus.sh"
make_rl_corpus "$orrery" "$tmp" 200 512 || fail "no corpus"

# rl_sections RUN_DIR: what both hosts' configs share.
rl_sections() {
  cat <<EOF
[env]
name = "calc"
[env.calc]
seed = 4
difficulty = 1
[replay]
path = "$tmp/learner/replay/db"
checkpoint_dir = "$tmp/learner/replay/checkpoints"
[[replay.tables]]
name = "trajectories"
preset = "queue"
max_size = 8
max_staleness = 4
[rl]
steps = 4
groups_per_step = 2
group_size = 4
checkpoint_every = 2
eval_tasks = 4
gloo_timeout_ms = 8000
[rl.rollout]
slots = 8
max_turns = 2
max_turn_tokens = 24
max_episode_tokens = 240
weights = "learner"
weight_poll_ms = 50
weight_chunk_mb = 1
[rl.learner]
lr = 1e-3
skip_uniform_groups = false
micro_batch_tokens = 1024
[fleet]
transport = "ipc"
heartbeat_ms = 200
heartbeat_timeout_ms = 5000
[[fleet.roles]]
role = "replay"
[[fleet.roles]]
role = "rollout"
[[fleet.roles]]
role = "learner"
EOF
}
# The learner's host: pretrains, then the RL phase.
cat >"$tmp/learner.toml" <<EOF
[run]
name = "remote-weights"
dir = "$tmp/learner"
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
$(rl_sections)
EOF

coordinator="ipc://$tmp/coordinator.sock"
"$orrery" launch "$tmp/learner.toml" --external --coordinator "$coordinator" >"$tmp/launch.log" 2>&1 &
launch_pid=$!
pids+=("$launch_pid")
coordinator_up() { "$orrery" fleet status --connect "$coordinator" --timeout-ms 1000 >/dev/null 2>&1; }
wait_for 240 coordinator_up || fail "the coordinator did not come up after pretraining"
[ -d "$tmp/learner/pretrain" ] || fail "no pretraining run in the learner's directory"

actor() {  # actor ROLE CONFIG: one instance, index 0, on its own ipc endpoint
  "$orrery" actor "$1" --index 0 --endpoint "ipc://$tmp/$1-0.sock" --coordinator "$coordinator" \
    --config "$2" --heartbeat-ms 200 >"$tmp/$1.log" 2>&1 &
  pids+=($!)
}
actor replay "$tmp/learner.toml"
actor learner "$tmp/learner.toml"

# The rollout's host: the binary, a config, and a copy of the initial policy; nothing else.
mkdir -p "$tmp/rollout_host"
cp -r "$tmp/learner/pretrain" "$tmp/rollout_host/init"
cat >"$tmp/rollout_host/rollout.toml" <<EOF
[run]
name = "remote-weights"
dir = "$tmp/rollout_host/run"
seed = 5
threads = 1
$(rl_sections | sed 's/^\[rl\]$/[rl]\ninit = "init"/')
EOF
actor rollout "$tmp/rollout_host/rollout.toml"

wait "$launch_pid"
rc=$?
pids=("${pids[@]:1}")
[ "$rc" -eq 0 ] || fail "launch --external exited $rc"
grep -qE "pass rate +before .* -> after " "$tmp/launch.log" || fail "no run summary"
[ -d "$tmp/learner/rl/checkpoints/step-00000004" ] || fail "the learner did not reach version 4"
grep -qE "weights: following learner:0 at ipc://$tmp/learner-0.sock" "$tmp/rollout.log" ||
  fail "the rollout did not follow the learner"
grep -qE "weights: version [1-4] from ipc://" "$tmp/rollout.log" || fail "no version fetched"
[ ! -e "$tmp/rollout_host/run/rl/weights" ] || fail "the rollout host grew a RUN/rl/weights"
fetched="$(ls "$tmp"/rollout_host/run/actors/rollout-0/weights/v-*.safetensors 2>/dev/null | tail -1)"
[ -n "$fetched" ] || fail "no fetched version in the rollout's own directory"
# The newest fetched copy is byte for byte the learner's file of that version (when still kept).
original="$tmp/learner/rl/weights/$(basename "$fetched")"
if [ -f "$original" ]; then cmp -s "$fetched" "$original" || fail "$fetched differs from $original"; fi
! ls "$tmp"/rollout_host/run/actors/rollout-0/weights/*.part >/dev/null 2>&1 ||
  fail "a partial copy was left behind"
echo "rl remote weights: ok"
