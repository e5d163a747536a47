#!/usr/bin/env bash
# The GPU demo's data (configs/demo_gpu.toml): the CPU demo's first pipeline — calculator
# transcripts of difficulty 1 (the whole-expression tool) and Genesis-Exodus, a byte-level BPE
# tokenizer of 1024 ids, token shards with 3% held out — plus the multi-step families the GPU demo
# trains: one-operation transcripts of difficulty 2 (two chained calls) and 3 (three). 3 in 5
# transcripts answer without the tool and those answers are wrong 60% of the time, so the
# pretrained policy often guesses and RL has something to improve.
#
#   scripts/gpu_demo_data.sh ORRERY KJV_TXT DATA_DIR [SCALE]
#
# KJV_TXT is `bible "Gen1:1-Exo40:38"` (bible-kjv; a GPU machine without it gets the file carried).
# Writes DATA_DIR (token shards, tokenizer.json) and, beside it, the transcripts and the tokenizer.
# SCALE (default 1) multiplies the transcript counts (20,000 + 60,000 + 60,000): the integration
# test uses a small one. Does nothing when DATA_DIR/.done exists. About 10 s on one core.
set -euo pipefail
if [[ $# -lt 3 || $# -gt 4 ]]; then
  echo "usage: scripts/gpu_demo_data.sh ORRERY KJV_TXT DATA_DIR [SCALE]" >&2
  exit 2
fi
orrery=$1 kjv=$2 data=$3 scale=${4:-1}
if [[ -f "$data/.done" ]]; then
  echo "gpu_demo_data.sh: $data is prepared"
  exit 0
fi
[[ -s "$kjv" ]] || { echo "gpu_demo_data.sh: $kjv: no such file (the Genesis-Exodus text)" >&2; exit 1; }
work="$(dirname "$data")"
mkdir -p "$work"
count() { awk -v n="$1" -v s="$scale" 'BEGIN { c = int(n * s); print (c < 1 ? 1 : c) }'; }
"$orrery" env synth --env calc --count "$(count 20000)" --seed 1 --difficulty 1 \
  --no-tool-fraction 0.6 --out "$work/calc.jsonl"
"$orrery" env synth --env calc --count "$(count 60000)" --seed 2 --difficulty 2 \
  --tool one_operation --no-tool-fraction 0.6 --out "$work/calc_d2.jsonl"
"$orrery" env synth --env calc --count "$(count 60000)" --seed 3 --difficulty 3 \
  --tool one_operation --no-tool-fraction 0.6 --out "$work/calc_d3.jsonl"
inputs=("$kjv" "$work/calc.jsonl" "$work/calc_d2.jsonl" "$work/calc_d3.jsonl")
"$orrery" tokenizer train --input "${inputs[@]}" --vocab-size 1024 --out "$work/tokenizer.json"
rm -rf "$data"
"$orrery" data prepare --tokenizer "$work/tokenizer.json" --input "${inputs[@]}" --out "$data" \
  --heldout-fraction 0.03 --seed 7
touch "$data/.done"
