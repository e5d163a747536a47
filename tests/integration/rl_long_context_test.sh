#!/usr/bin/env bash
# The long-context RL run's plumbing on the CPU (configs/rl_long_context.toml in miniature):
# retrieval episodes whose prompt carries the whole document ([env.retrieval] document =
# "in_prompt", 2000 to 3000 words: about 2.3K to 3.5K tokens with this tokenizer), a very small model
# pretrained for a few steps on such transcripts (`orrery env synth --env retrieval`), then
# `orrery launch` through 2 policy updates. Checks: every episode is whole (none cut by the
# context: rollout/truncated_context_total = 0), episodes are thousands of tokens long, the
# learner trained sequences that long and reports its rate, and scripts/long_rl_report.py (the
# GPU run's report) prints every figure. What only a GPU shows (1M-token prompts, peak device
# memory) is scripts/gpu_long_rl.sh's.
# usage: rl_long_context_test.sh ORRERY_BINARY SOURCE_DIR
set -euo pipefail
orrery="$1"
src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -30 "$f" >&2; }; done
  exit 1
}

# --- data: in-prompt retrieval transcripts (document, question, "Answer: N"), a tokenizer, shards.
"$orrery" env synth --env retrieval --count 24 --doc-tokens 2000 --seed 1 \
  --out "$tmp/retrieval.jsonl" >"$tmp/data.log" 2>&1 || fail "env synth exited $?"
"$orrery" tokenizer train --input "$tmp/retrieval.jsonl" --vocab-size 1024 \
  --out "$tmp/tokenizer.json" >>"$tmp/data.log" 2>&1 || fail "tokenizer train exited $?"
"$orrery" data prepare --tokenizer "$tmp/tokenizer.json" --input "$tmp/retrieval.jsonl" \
  --out "$tmp/data" --heldout-fraction 0.1 --seed 3 >>"$tmp/data.log" 2>&1 ||
  fail "data prepare exited $?"
sed -e "s/^max_seq_len = .*/max_seq_len = 8192/" -e "s/^vocab_size = .*/vocab_size = 1024/" \
  "$src/tests/fixtures/small_hybrid_model.toml" >"$tmp/model.toml"

# --- the config: the GPU run's RL sections on the CPU, small.
cat >"$tmp/long.toml" <<TOML
[run]
name = "rl-long-test"
dir = "$tmp/run"
seed = 5
threads = 1
[pretrain]
model = "model.toml"
data = "data"
tokens_per_step = 2048
micro_batch_tokens = 2048
eval_every = 2
eval_tokens = 1024
checkpoint_every = 2
keep_checkpoints = 1
[optimizer]
lr = 3e-3
warmup_steps = 1
[[stages]]
name = "s1024"
seq_len = 1024
tokens = 8192
[env]
name = "retrieval"
[env.retrieval]
seed = 3
document = "in_prompt"
doc_tokens = 2000
doc_tokens_max = 3000
num_facts = 4
[replay]
path = "$tmp/run/replay/db"
checkpoint_dir = "$tmp/run/replay/checkpoints"
[[replay.tables]]
name = "trajectories"
preset = "queue"
max_size = 4
max_staleness = 4
[rl]
steps = 2
groups_per_step = 2
group_size = 2
checkpoint_every = 2
eval_tasks = 2
[rl.rollout]
slots = 4
max_turns = 1
max_turn_tokens = 8
max_episode_tokens = 8192
max_step_tokens = 4096
[rl.learner]
lr = 1e-3
skip_uniform_groups = false
micro_batch_tokens = 4096
recompute_layers = true       # read here, used by the GPU learner
[fleet]
transport = "ipc"
heartbeat_ms = 200
heartbeat_timeout_ms = 10000
metrics_endpoint = "ipc://$tmp/run/fleet/metrics.sock"
[[fleet.roles]]
role = "replay"
[[fleet.roles]]
role = "rollout"
[[fleet.roles]]
role = "learner"
TOML
"$orrery" config check "$tmp/long.toml" >/dev/null 2>"$tmp/check.log" ||
  fail "config check: $(cat "$tmp/check.log")"

# A bad value is one line naming the key, the value and what is expected.
sed 's/^doc_tokens_max = 3000/doc_tokens_max = 900/' "$tmp/long.toml" >"$tmp/bad.toml"
out="$("$orrery" config check "$tmp/bad.toml" 2>&1)" && fail "doc_tokens_max below doc_tokens accepted"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "bad doc_tokens_max: more than one line: $out"
printf '%s\n' "$out" | grep -q "env.retrieval.doc_tokens_max: expected 0 .* at least env.retrieval.doc_tokens = 2000, got 900" ||
  fail "bad doc_tokens_max: $out"

# --- the run.
timeout 150 "$orrery" launch "$tmp/long.toml" >"$tmp/launch.log" 2>&1 || fail "launch exited $?"
grep -qE "pass rate +before [0-9.]+% \([0-9]+/2\) -> after " "$tmp/launch.log" || fail "no summary"
python3 "$src/scripts/long_rl_report.py" "$tmp/run" --check-updates 2 --check-min-length 2000 \
  >"$tmp/report.log" 2>&1 || fail "long_rl_report.py: $(grep CHECK "$tmp/report.log")"
grep -qE "^  episodes: [0-9]+ groups, length [0-9]+ \.\. [0-9]+ tokens" "$tmp/report.log" ||
  fail "no episode lengths in the report"
grep -qE "^  rollout: [0-9,]+ fed tokens/s" "$tmp/report.log" || fail "no rollout rate"
grep -qE "^  truncated episodes: 0 by the context" "$tmp/report.log" || fail "an episode was cut"
grep -qE "^  learner: 2 updates, [0-9,]+ tokens in .* longest sequence [0-9,]{5,} tokens" \
  "$tmp/report.log" || fail "no learner rate or sequences shorter than 1,000 tokens"
cat "$tmp/report.log"
echo "rl_long_context_test: all checks passed"
