#!/usr/bin/env bash
# GPU pretraining through every stage of configs/pretrain/gpu.toml, twice: once uninterrupted and
# once stopped after step 12 and resumed (issue 22: a resumed run continues exactly). Prints each
# stage's held-out loss and the SHA-256 of both runs' final checkpoint files, and exits non-zero
# when a run fails or the two final checkpoints differ; then `orrery generate --device cuda` from
# the final checkpoint. About 4 minutes on an H200 (small, 28 steps; most of it writing 7 GB
# checkpoints).
#
#   scripts/gpu_pretrain_check.sh BIN_DIR DATA_DIR
#
# BIN_DIR: `orrery` built with CUDA and its libraries (scripts/gpu_bundle.sh DIR build/bin/orrery:
# DIR/bundle.tar.xz), DATA_DIR: gpu.toml's data (`orrery data prepare` output, as scripts/demo.sh
# writes runs/demo/data). Logs and a summary under $OUT (or ./gpu-pretrain-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-pretrain-out}"
mkdir -p "$out"
bin="${1:?usage: scripts/gpu_pretrain_check.sh BIN_DIR DATA_DIR}"
data="${2:?usage: scripts/gpu_pretrain_check.sh BIN_DIR DATA_DIR}"
source scripts/gpu_bin_env.sh "$bin" || exit 1
work="$(mktemp -d)"
status=0
run() {  # NAME ARGS...: one orrery pretrain, its log under $out
  local name=$1 start=$SECONDS
  shift
  timeout "${RUN_TIMEOUT:-300}" "$bin/orrery" pretrain --config configs/pretrain/gpu.toml \
    --data "$data" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  [[ $rc -eq 0 ]] || status=1
}
run whole --out "$work/whole"
run part --out "$work/resumed" --max-steps 12
run resume --out "$work/resumed" --resume
grep -h "held-out loss" "$out/whole.log" | sed 's/^.* I //' | tee -a "$out/summary.txt"
hashes() {  # the final checkpoint's files and their SHA-256, relative to the run
  local last
  last="$(ls -d "$1"/checkpoints/step-* 2>/dev/null | sort | tail -1)"
  [[ -n "$last" ]] && (cd "$last" && sha256sum ./*.safetensors)
}
hashes "$work/whole" > "$out/whole.sha256"
hashes "$work/resumed" > "$out/resumed.sha256"
if [[ -s "$out/whole.sha256" ]] && cmp -s "$out/whole.sha256" "$out/resumed.sha256"; then
  echo "final checkpoints: identical ($(wc -l < "$out/whole.sha256") files)" | tee -a "$out/summary.txt"
else
  echo "final checkpoints: DIFFERENT or missing" | tee -a "$out/summary.txt"
  diff "$out/whole.sha256" "$out/resumed.sha256" | tee -a "$out/summary.txt"
  status=1
fi
# The checkpoint as a user takes it: `orrery generate --device cuda` (greedy) from the
# uninterrupted run's last checkpoint, on five held-out calculator prompts.
"$bin/orrery" env synth --env calc --count 5 --seed 2 --split test --difficulty 1 \
  --out "$work/prompts.jsonl" > /dev/null 2>&1
start=$SECONDS
if timeout 120 "$bin/orrery" generate --device cuda --checkpoint "$work/whole" \
  --prompts "$work/prompts.jsonl" --max-tokens 48 --show 5 > "$out/generate.log" 2>&1; then
  echo "generate --device cuda: exit 0 in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
else
  echo "generate --device cuda: FAILED (see generate.log)" | tee -a "$out/summary.txt"
  status=1
fi
rm -rf "$work"
exit $status
