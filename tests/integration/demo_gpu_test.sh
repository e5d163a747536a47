#!/usr/bin/env bash
# The GPU demo's plumbing on the CPU: configs/demo_gpu.toml itself, changed only where a CPU and a
# tiny budget need it (scripts/toml_override.py: run.device = "cpu", the tiny model, a few steps),
# on the data scripts/gpu_demo_data.sh prepares (at 1% of its transcripts). `orrery launch` must
# pretrain, score per family, run the RL fleet with weights = "shared" (on the CPU: the learner's
# memfd buffers, the same protocol as CUDA IPC), score again and print the summary with a line per
# family; the rollout must have taken versions from the shared buffer (gpu_demo_report.py
# --check-shared) and RUN/summary.json must hold the phases and families. What cannot be checked
# here is the GPU itself: scripts/gpu_demo.sh runs the real thing in one device call.
# usage: demo_gpu_test.sh ORRERY_BINARY SOURCE_DIR
set -euo pipefail
orrery="$1"
src="$2"
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

# --- data: the demo's pipeline at 1% (200 + 400 + 400 transcripts) on a little text.
if command -v bible >/dev/null; then bible "Gen1:1-Gen3:24" >"$tmp/kjv.txt"; else
  for _ in $(seq 1 60); do echo "In the beginning God created the heaven and the earth."; done >"$tmp/kjv.txt"
fi
"$src/scripts/gpu_demo_data.sh" "$orrery" "$tmp/kjv.txt" "$tmp/data" 0.01 >"$tmp/data.log" 2>&1 ||
  fail "gpu_demo_data.sh exited $?"
[ -f "$tmp/data/.done" ] && [ -f "$tmp/data/tokenizer.json" ] || fail "no prepared data"
"$src/scripts/gpu_demo_data.sh" "$orrery" "$tmp/kjv.txt" "$tmp/data" 0.01 | grep -q "is prepared" ||
  fail "a prepared data directory was prepared again"

# --- the config: demo_gpu.toml on the CPU, tiny budget.
python3 "$src/scripts/toml_override.py" "$src/configs/demo_gpu.toml" "$tmp/demo_gpu_cpu.toml" \
  run.device='"cpu"' run.dtype='"f32"' run.threads=1 run.dir="\"$tmp/run\"" \
  pretrain.model="\"$src/configs/model/tiny.toml\"" pretrain.data="\"$tmp/data\"" \
  pretrain.tokens_per_step=1024 pretrain.micro_batch_tokens=1024 pretrain.eval_every=2 \
  pretrain.eval_tokens=1024 pretrain.checkpoint_every=2 \
  optimizer.warmup_steps=1 stages.seq_len=256 stages.tokens=2048 \
  replay.path="\"$tmp/run/replay/db\"" replay.checkpoint_dir="\"$tmp/run/replay/checkpoints\"" \
  replay.tables.max_size=8 \
  rl.steps=3 rl.groups_per_step=4 rl.group_size=4 rl.checkpoint_every=1 rl.eval_tasks=8 \
  rl.rollout.slots=16 rl.rollout.max_turn_tokens=32 rl.rollout.max_episode_tokens=400 \
  rl.learner.micro_batch_tokens=2048 rl.learner.skip_uniform_groups=false \
  fleet.metrics_endpoint="\"ipc://$tmp/run/fleet/metrics.sock\"" fleet.dashboard=false ||
  fail "toml_override.py exited $?"
grep -q '^weights = "shared"' "$tmp/demo_gpu_cpu.toml" || fail "the config does not share weights"
"$orrery" config check "$tmp/demo_gpu_cpu.toml" >/dev/null 2>"$tmp/check.log" ||
  fail "config check: $(cat "$tmp/check.log")"

# --- the whole job.
timeout 280 "$orrery" launch "$tmp/demo_gpu_cpu.toml" >"$tmp/launch.log" 2>&1 ||
  fail "launch exited $?"
grep -q "pretrain summary: finished" "$tmp/launch.log" || fail "no pretraining summary"
grep -qE "pass rate +before [0-9.]+% \([0-9]+/8\) -> after [0-9.]+% \([0-9]+/8\)" "$tmp/launch.log" ||
  fail "no pass-rate summary"
for family in calc/d2 calc/d3; do
  grep -qE "^ +$family +before [0-9.]+% \([0-9]+/[0-9]+\) -> after " "$tmp/launch.log" ||
    fail "no summary line for $family"
done
grep -qE "wall time +pretraining [0-9]+ s, initial score [0-9]+ s, RL phase [0-9]+ s" "$tmp/launch.log" ||
  fail "no wall time by phase"
grep -q "sharing versions with the rollouts of this host: 2 buffers of [0-9]* bytes on cpu" \
  "$tmp/launch.log" || fail "the learner did not share its versions"
python3 - "$tmp/run/summary.json" <<'EOF' || fail "summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
assert set(s["seconds"]) == {"pretrain", "eval_before", "rl", "eval_after"}, s["seconds"]
for side in ("before", "after"):
    fam = s[side]["families"]
    assert set(fam) == {"calc/d2", "calc/d3"}, fam
    assert sum(f["episodes"] for f in fam.values()) == 8, fam
EOF
python3 "$src/scripts/gpu_demo_report.py" "$tmp/run" --check-shared >"$tmp/shared.log" 2>&1 ||
  fail "the rollout took no version from the shared buffer: $(cat "$tmp/shared.log")"
python3 "$src/scripts/gpu_demo_report.py" "$tmp/run" --data-seconds 1 >"$tmp/report.log" 2>&1 ||
  fail "gpu_demo_report.py exited $?"
grep -qE "^  calc/d3 " "$tmp/report.log" || fail "the report has no calc/d3 row"
grep -qE "rollout, [1-9][0-9]* versions from the shared buffer" "$tmp/report.log" ||
  fail "the report counts no shared versions"
echo "demo_gpu_test: all checks passed"
