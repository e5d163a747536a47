#!/usr/bin/env bash
# The GPU demo in one device call (issue 26 item 6): `orrery launch configs/demo_gpu.toml` on one
# H200 — data, pretraining, scores per family, asynchronous RL with the rollout taking each
# version through CUDA IPC, scores again, the summary — then the benchmarks the budget leaves room
# for: weight update time by phase for the demo model and `small` (shared_weights_gpu_bench), and
# async against --sync updates/s (two RL-only launches from the demo's pretrained model).
#
#   scripts/gpu_demo.sh BIN_DIR DATA_DIR
#
# BIN_DIR: binaries built here with CUDA and packed by scripts/gpu_bundle.sh (BIN_DIR/bundle.tar.xz:
# orrery, shared_weights_gpu_tests, shared_weights_gpu_bench and the shared libraries a bare GPU
# machine lacks), or an unpacked directory of them. DATA_DIR: kjv.txt (`bible "Gen1:1-Exo40:38"`;
# the GPU machine has no bible-kjv), from which scripts/gpu_demo_data.sh prepares runs/demo-gpu/data,
# or an already prepared data directory (index.safetensors).
#
# Time: everything ends inside TIME_LIMIT seconds (default 560; the launch is given what is left
# after the IPC test and the data, less a reserve for the benchmarks and packing, and is stopped
# with SIGTERM, then SIGKILL, when it runs over: re-running on the same machine continues it).
# Every step's exit status and seconds go to $OUT/summary.txt with the run's figures; logs, the
# run's summary, scores, metrics and the benchmark output are packed into $OUT/gpu-demo.tar.gz.
# Two files come back. Failure modes each print one line in summary.txt ("launch: exit 124 in
# 400 s (cut by its 400 s limit)", "no GPU: ...", "no data: ...").
#
# DEMO=0 runs only the IPC test and the two weight-update benchmarks (about 2 minutes).
#
# A rehearsal on a machine without a GPU runs the same steps on another config of the same layout
# (run.dir run/, pretrain.data data/ beside it in runs/demo-gpu/, e.g. demo_gpu.toml with
# run.device = "cpu" and a tiny budget through scripts/toml_override.py): CONFIG=that.toml
# DATA_SCALE=0.01 REQUIRE_GPU=0 scripts/gpu_demo.sh BIN_DIR DATA_DIR (the GPU steps then fail or
# skip, each in one line).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
limit=${TIME_LIMIT:-560}
config=${CONFIG:-configs/demo_gpu.toml}
out="${OUT:-gpu-demo-out}"
mkdir -p "$out/logs"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: > "$summary"
source scripts/gpu_steps.sh  # say, left, step
pack() {  # the run's figures and every log into one archive; the logs folder goes
  local f
  for f in run/summary.json run/rl/eval_before.json run/rl/eval_after.json \
           run/learner-0/metrics.jsonl run/rollout-0/metrics.jsonl run/pretrain/metrics.jsonl \
           cmp-async/learner-0/metrics.jsonl cmp-sync/learner-0/metrics.jsonl; do
    if [[ -f runs/demo-gpu/$f ]]; then
      mkdir -p "$out/logs/$(dirname "$f")" && cp "runs/demo-gpu/$f" "$out/logs/$f"
    fi
  done
  tar -czf "$out/gpu-demo.tar.gz" -C "$out" logs && rm -rf "$out/logs"
  say "total: $((SECONDS - start)) s"
}
bin="${1:?usage: scripts/gpu_demo.sh BIN_DIR DATA_DIR}"
data="${2:?usage: scripts/gpu_demo.sh BIN_DIR DATA_DIR}"
open_bundle "$bin"

status=0
# 1. The IPC check: a second process's weights equal the learner's, bit for bit (~10 s).
if [[ -x "$bin/shared_weights_gpu_tests" ]]; then
  step ipc_test 60 "$bin/shared_weights_gpu_tests" || status=1
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |child: version" "$out/logs/ipc_test.log" | tee -a "$summary"
fi

demo() {
  # 2. Data: the carried text through the demo's pipeline, or a prepared directory.
  t=$SECONDS
  mkdir -p runs/demo-gpu
  if [[ -f "$data/index.safetensors" ]]; then
    rm -rf runs/demo-gpu/data && ln -s "$(cd "$data" && pwd)" runs/demo-gpu/data && touch runs/demo-gpu/data/.done
  elif [[ -f "$data/kjv.txt" ]]; then
    step data 120 scripts/gpu_demo_data.sh "$bin/orrery" "$data/kjv.txt" runs/demo-gpu/data \
      "${DATA_SCALE:-1}" || status=1
  else
    say "no data: $data has neither kjv.txt nor index.safetensors"
    pack
    exit 1
  fi
  data_seconds=$((SECONDS - t))

  # 3. The main job. Reserve: the benchmarks of the demo model (~30 s) and packing.
  reserve=45 step launch 600 "$bin/orrery" launch "$config" || status=1
  grep -E "^(== |run summary|  (wall time|pass rate|tool use|run directory|final policy)|    calc/)" \
    "$out/logs/launch.log" | tee -a "$summary"
  grep -E " E \[|FAILED|error" "$out/logs/launch.log" | head -5 | tee -a "$summary"
  python3 scripts/gpu_demo_report.py runs/demo-gpu/run --data-seconds "$data_seconds" \
    > "$out/logs/report.log" 2>&1
  tee -a "$summary" < "$out/logs/report.log"
}
if [[ ${DEMO:-1} == 1 ]]; then
  demo
else
  say "demo: skipped (DEMO=0)"
fi

# 4. Weight update time by phase: the demo model, then small.
bench() {  # NAME CONFIG VERSIONS LIMIT
  [[ -x "$bin/shared_weights_gpu_bench" ]] || return 0
  step "bench_$1" "$4" "$bin/shared_weights_gpu_bench" "$2" "$3" runs/demo-gpu/bench || status=1
  sed -n '/^weight update of/,$p' "$out/logs/bench_$1.log" | tee -a "$summary"
}
reserve=8 bench gpu_demo configs/model/gpu-demo.toml 8 40
reserve=8 bench small configs/model/small.toml 6 150

# 5. Async against sync, same updates, from the demo's pretrained model (when 200 s are left).
if [[ ${DEMO:-1} == 1 ]] && (( $(left) > 200 )) &&
   compgen -G "runs/demo-gpu/run/pretrain/checkpoints/step-*" > /dev/null; then
  for mode in async sync; do
    python3 scripts/toml_override.py "$config" "runs/demo-gpu/cmp-$mode.toml" \
      --drop pretrain --drop optimizer --drop stages \
      run.dir="\"$PWD/runs/demo-gpu/cmp-$mode\"" rl.init="\"$PWD/runs/demo-gpu/run/pretrain\"" \
      rl.steps=20 rl.eval_tasks=0 rl.learner.skip_uniform_groups=false \
      replay.path="\"$PWD/runs/demo-gpu/cmp-$mode/replay/db\"" \
      replay.checkpoint_dir="\"$PWD/runs/demo-gpu/cmp-$mode/replay/checkpoints\"" \
      fleet.metrics_endpoint="\"ipc://runs/demo-gpu/cmp-$mode/fleet/metrics.sock\"" \
      fleet.dashboard=false || status=1
    flag=""
    [[ $mode == sync ]] && flag=--sync
    reserve=8 step "launch_$mode" 95 "$bin/orrery" launch "runs/demo-gpu/cmp-$mode.toml" $flag ||
      status=1
  done
  python3 scripts/gpu_demo_report.py runs/demo-gpu/run --compare runs/demo-gpu/cmp-async \
    runs/demo-gpu/cmp-sync 2>&1 | sed -n '/^async:/,$p' | tee -a "$summary"
elif [[ ${DEMO:-1} == 1 ]]; then
  say "async vs sync: skipped ($(left) s left)"
fi
pack
exit $status
