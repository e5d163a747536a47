#!/usr/bin/env bash
# The long-context RL run in one device call (issue 26 item 7): `orrery launch
# configs/rl_long_context.toml` on one H200 — data (in-prompt retrieval transcripts, a tokenizer,
# shards: written here, nothing carried), a few pretraining steps of small-1m, 6 asynchronous
# policy updates on retrieval episodes whose prompts carry documents of 128K-240K tokens, learner
# and rollout sharing the GPU — then the figures: episode lengths, truncated episodes by limit,
# rollout tokens/s (fed and generated), learner tokens/s per update, the longest sequence trained,
# peak device memory per role (the CUDA caching allocators') and of the whole GPU (nvidia-smi
# every 0.5 s); then, with the time left, the learner's memory at one long sequence alone
# (gpu_model_bench small-1m with recompute: the probe of the learner's limit, config header).
#
#   scripts/gpu_long_rl.sh BIN_DIR
#
# How to run it (next device call; BIN_DIR built here with CUDA, ignored by git, carried):
#   cmake --preset cuda && cmake --build build-cuda -j2 --target orrery gpu_model_bench
#   scripts/gpu_bundle.sh .gpu/longrl build-cuda/bin/orrery build-cuda/tests/gpu_model_bench
#   run(command="OUT=$OUT scripts/gpu_long_rl.sh .gpu/longrl", carry=[".gpu/longrl"],
#       timeout_s=600)
#
# BIN_DIR: orrery (and gpu_model_bench for the probe), or BIN_DIR/bundle.tar.xz of them
# (scripts/gpu_bin_env.sh). Environment:
#   TIME_LIMIT (540)  every step ends inside it: the launch gets what is left less a reserve for
#                     the report and packing, and is stopped (SIGTERM, then SIGKILL) past it
#   PROBE ("262144")  sequence lengths for gpu_model_bench after the launch, each only if 150 s
#                     remain ("262144 524288" adds 512K; "" skips)
#   OVERRIDES         SECTION.KEY=VALUE ... for scripts/toml_override.py, e.g.
#                     OVERRIDES="env.retrieval.doc_tokens_max=300000 rl.rollout.max_episode_tokens=360000"
#   CONFIG, DATA_COUNT (1000 transcripts), REQUIRE_GPU (1): a rehearsal without a GPU runs another
#                     config of the same layout (runs/long-rl/run, runs/long-rl/data) on the CPU:
#                     REQUIRE_GPU=0 DATA_COUNT=40 PROBE= OVERRIDES='run.device="cpu" ...'
# Outputs in $OUT (default ./gpu-long-rl-out): summary.txt (each step's exit status and seconds,
# then the report) and long-rl.tar.gz (logs, the run's summary and metrics, the GPU memory
# samples). A failure is one line in summary.txt ("launch: exit 124 in 400 s (cut by ...)").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
start=$SECONDS
limit=${TIME_LIMIT:-540}
config=${CONFIG:-configs/rl_long_context.toml}
root=runs/long-rl
out="${OUT:-gpu-long-rl-out}"
mkdir -p "$out/logs" "$root"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: > "$summary"
source scripts/gpu_steps.sh  # say, left, step
sampler=""
pack() {  # the run's figures and every log into one archive; the logs folder goes
  [[ -n $sampler ]] && kill "$sampler" 2>/dev/null
  local f
  for f in run/summary.json run/learner-0/metrics.jsonl run/rollout-0/metrics.jsonl \
           run/pretrain/metrics.jsonl; do
    if [[ -f $root/$f ]]; then
      mkdir -p "$out/logs/$(dirname "$f")" && cp "$root/$f" "$out/logs/$f"
    fi
  done
  tar -czf "$out/long-rl.tar.gz" -C "$out" logs && rm -rf "$out/logs"
  say "total: $((SECONDS - start)) s"
}
bin="${1:?usage: scripts/gpu_long_rl.sh BIN_DIR}"
open_bundle "$bin"
if command -v nvidia-smi > /dev/null && nvidia-smi > /dev/null 2>&1; then
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu \
    --format=csv,noheader,nounits -lms 500 > "$out/logs/gpu_memory.csv" 2>/dev/null &
  sampler=$!
fi

status=0
# 1. Data: in-prompt retrieval transcripts of 2,000-word documents, a 1024-id tokenizer (every
# filler word one token), shards (~10 s on one core for 1000 transcripts, 2.3M tokens).
make_data() {
  local o="$bin/orrery"
  "$o" env synth --env retrieval --count "${DATA_COUNT:-1000}" --doc-tokens 2000 --seed 1 \
    --out "$root/retrieval.jsonl" &&
    "$o" tokenizer train --input "$root/retrieval.jsonl" --vocab-size 1024 \
      --out "$root/tokenizer.json" &&
    rm -rf "$root/data" &&
    "$o" data prepare --tokenizer "$root/tokenizer.json" --input "$root/retrieval.jsonl" \
      --out "$root/data" --heldout-fraction 0.02 --seed 7 &&
    touch "$root/data/.done"
}
export -f make_data
export bin root
if [[ -f $root/data/.done ]]; then
  say "data: prepared already"
else
  step data 120 bash -c make_data || status=1
  grep -h "^data:" "$out/logs/data.log" | tee -a "$summary"
fi

# 2. The launch: pretraining, the RL phase, the summary. Reserve: the report and packing.
if [[ -n ${OVERRIDES:-} ]]; then
  # Beside the config, so that its relative paths still resolve.
  variant="$(dirname "$config")/.gpu_long_rl_variant.toml"
  # shellcheck disable=SC2086  # OVERRIDES is a list of words
  python3 scripts/toml_override.py "$config" "$variant" $OVERRIDES > "$out/logs/override.log" 2>&1 ||
    { say "overrides: $(tail -1 "$out/logs/override.log")"; pack; exit 1; }
  config="$variant"
  say "config: $config with $OVERRIDES"
fi
steps=$("$bin/orrery" config check "$config" 2>/dev/null | sed -n 's/^rl\.steps = \([0-9]*\).*/\1/p')
reserve=30 step launch 600 "$bin/orrery" launch "$config" || status=1
grep -E "^(== |run summary|  (wall time|pass rate|run directory|final policy))" \
  "$out/logs/launch.log" | tee -a "$summary"
grep -E " E \[|FAILED|error|out of memory" "$out/logs/launch.log" | head -5 | tee -a "$summary"
python3 scripts/long_rl_report.py "$root/run" ${steps:+--check-updates "$steps"} \
  --check-min-length 1000 > "$out/logs/report.log" 2>&1 || status=1
tee -a "$summary" < "$out/logs/report.log"
if [[ -s $out/logs/gpu_memory.csv ]]; then
  awk -F', *' '$2 > m { m = $2; t = $3 } END { if (m) printf "gpu memory (nvidia-smi, every 0.5 s): peak %d MiB of %d MiB\n", m, t }' \
    "$out/logs/gpu_memory.csv" | tee -a "$summary"
fi

# 3. The learner's memory at one long sequence, alone on the GPU (the limit of the config header).
for len in ${PROBE-262144}; do
  [[ -x "$bin/gpu_model_bench" ]] || { say "probe: no gpu_model_bench in $bin"; break; }
  if (( $(left) < 150 )); then
    say "probe $len: skipped ($(left) s left)"
    continue
  fi
  reserve=10 step "probe_$len" 140 "$bin/gpu_model_bench" configs/model/small-1m.toml "$len" 1 1 \
    bf16 recompute || status=1
  grep -hiE "peak|tokens/s|out of memory" "$out/logs/probe_$len.log" | tail -3 | tee -a "$summary"
done
pack
exit $status
