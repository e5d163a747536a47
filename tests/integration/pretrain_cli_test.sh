#!/usr/bin/env bash
# Staged pretraining end to end with the real binary: data from `orrery env synth`, a tokenizer
# from `orrery tokenizer train`, shards from `orrery data prepare`, then `orrery pretrain` of a very
# small hybrid model through two stages (stopped with --max-steps, continued with --resume),
# `orrery generate` from its checkpoint, a corrupt checkpoint refused, and bad configs failing with
# one line that names the file and key.
# usage: pretrain_cli_test.sh ORRERY_BINARY
set -euo pipefail
orrery="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_error PATTERN CMD...: CMD exits non-zero with exactly one line on stderr holding PATTERN.
expect_error() {
  local pattern="$1"
  shift
  if "$@" >"$tmp/out" 2>"$tmp/err"; then fail "accepted: $*"; fi
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "error of '$*' is not one line: $(cat "$tmp/err")"
  grep -qF -- "$pattern" "$tmp/err" || fail "error of '$*' lacks '$pattern': $(cat "$tmp/err")"
}

# --- data: calculator transcripts and a little plain text.
"$orrery" env synth --env calc --count 300 --seed 1 --out "$tmp/calc.jsonl" >/dev/null
python3 - "$tmp/text.txt" <<'PY'
import random, sys
rng = random.Random(5)
words = "the of and to in a is that for it as was with be by on not he this are or his".split()
with open(sys.argv[1], "w") as f:
    for _ in range(60):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) + ".\n\n")
PY
"$orrery" tokenizer train --input "$tmp/text.txt" "$tmp/calc.jsonl" --vocab-size 320 \
  --out "$tmp/tokenizer.json" >/dev/null
"$orrery" data prepare --tokenizer "$tmp/tokenizer.json" --input "$tmp/text.txt" "$tmp/calc.jsonl" \
  --out "$tmp/data" --heldout-fraction 0.1 --seed 3 >/dev/null
[ -f "$tmp/data/index.safetensors" ] || fail "data prepare wrote no index"

# --- a very small model (K M, a MoE layer) and a two-stage config.
cp "$(dirname "$0")/../fixtures/small_hybrid_model.toml" "$tmp/model.toml"
# write_config FILE [EXTRA_PRETRAIN_LINE] [STAGE2_SEQ_LEN] [STAGE2_TOKENS] [DATA]
write_config() {
  cat >"$1" <<EOF
[run]
seed = 3
deterministic = true
threads = 2
[pretrain]
model = "model.toml"
data = "${5:-data}"
tokens_per_step = 512
micro_batch_tokens = 256
eval_every = 2
eval_tokens = 256
checkpoint_every = 2
keep_checkpoints = 2
${2:-}
[optimizer]
lr = 3e-3
warmup_steps = 1
[[stages]]
name = "ctx64"
seq_len = 64
tokens = 1024
[[stages]]
name = "second"
seq_len = ${3:-128}
tokens = ${4:-1024}
EOF
}
write_config "$tmp/pretrain.toml"
"$orrery" config check "$tmp/pretrain.toml" >/dev/null || fail "config check rejects a good config"

# --- pretrain, stopped after 3 of 4 steps, then resumed to the end.
"$orrery" pretrain --config "$tmp/pretrain.toml" --out "$tmp/run" --max-steps 3 >"$tmp/p1.txt" 2>&1 ||
  fail "pretrain failed: $(cat "$tmp/p1.txt")"
grep -q " 2 threads" "$tmp/p1.txt" || fail "[run] threads = 2 not applied: $(head -3 "$tmp/p1.txt")"
grep -q "pretrain summary: stopped after 3 steps" "$tmp/p1.txt" || fail "no summary: $(cat "$tmp/p1.txt")"
[ -f "$tmp/run/metrics.jsonl" ] || fail "no metrics.jsonl"
[ -f "$tmp/run/checkpoints/step-00000003/model.safetensors" ] || fail "no checkpoint at step 3"
expect_error "--resume" "$orrery" pretrain --config "$tmp/pretrain.toml" --out "$tmp/run"
"$orrery" pretrain --config "$tmp/pretrain.toml" --out "$tmp/run" --resume >"$tmp/p2.txt" 2>&1 ||
  fail "resume failed: $(cat "$tmp/p2.txt")"
grep -q "resumed from .*step-00000003 at step 3" "$tmp/p2.txt" || fail "did not resume: $(cat "$tmp/p2.txt")"
grep -q "pretrain summary: finished after 4 steps" "$tmp/p2.txt" || fail "not finished: $(cat "$tmp/p2.txt")"
[ -f "$tmp/run/checkpoints/step-00000004/trainer.json" ] || fail "no final checkpoint"
python3 - "$tmp/run/metrics.jsonl" <<'PY' || fail "metrics.jsonl lacks the documented fields"
import json, sys
steps = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r["metrics"]:
        steps[r["step"]] = r["metrics"]
assert sorted(steps) == [1, 2, 3, 4], sorted(steps)
for s, m in steps.items():
    for key in ("loss", "lr", "grad_norm", "tokens_per_second", "stage", "seq_len", "expert_load/layer0"):
        assert key in m, (s, key)
    assert isinstance(m["expert_load/layer0"], list), s
assert steps[4]["seq_len"] == 128 and "eval_loss" in steps[4], steps[4]
PY

# --- generate from the checkpoint; a prompt longer than max_seq_len is refused.
"$orrery" generate --checkpoint "$tmp/run" --prompt "What is 2+3?" --max-tokens 8 >"$tmp/g.txt" 2>&1 ||
  fail "generate failed: $(cat "$tmp/g.txt")"
grep -q "generated: " "$tmp/g.txt" || fail "no generation: $(cat "$tmp/g.txt")"
# --device cuda: the GPU model generates where a GPU is visible; elsewhere one clear line.
if "$orrery" generate --checkpoint "$tmp/run" --prompt "What is 2+3?" --max-tokens 8 \
  --device cuda --dtype f32 >"$tmp/gc.txt" 2>&1; then
  grep -q "generated: " "$tmp/gc.txt" || fail "no generation on cuda: $(cat "$tmp/gc.txt")"
else
  [ "$(wc -l <"$tmp/gc.txt")" -eq 1 ] || fail "generate --device cuda: not one line: $(cat "$tmp/gc.txt")"
  grep -qE "^orrery: --device cuda: gpu model: no CUDA device 0 is visible to this process" \
    "$tmp/gc.txt" || fail "generate --device cuda: unexpected message: $(cat "$tmp/gc.txt")"
fi
expect_error "expected cpu or cuda" "$orrery" generate --checkpoint "$tmp/run" --prompt hi --device tpu
# A prompt near the limit: generation stops at max_seq_len instead of failing.
"$orrery" generate --checkpoint "$tmp/run" --prompt "$(python3 -c 'print("one two three " * 20)')" \
  --max-tokens 400 >"$tmp/g2.txt" 2>&1 || fail "generate near max_seq_len failed: $(cat "$tmp/g2.txt")"
# ORRERY_NUM_THREADS takes precedence over [run] threads.
ORRERY_NUM_THREADS=3 "$orrery" pretrain --config "$tmp/pretrain.toml" --out "$tmp/run3" --max-steps 1 \
  >"$tmp/p3.txt" 2>&1 || fail "pretrain failed: $(cat "$tmp/p3.txt")"
grep -q " 3 threads" "$tmp/p3.txt" || fail "ORRERY_NUM_THREADS did not win: $(head -3 "$tmp/p3.txt")"
expect_error "max_seq_len" "$orrery" generate --checkpoint "$tmp/run" \
  --prompt "$(python3 -c 'print("one two three " * 200)')" --max-tokens 4

# --- a flipped byte in model.safetensors is refused, naming the file.
cp -r "$tmp/run/checkpoints/step-00000004" "$tmp/corrupt"
python3 - "$tmp/corrupt/model.safetensors" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) - 100] ^= 0x40
open(path, "wb").write(bytes(data))
PY
expect_error "model.safetensors" "$orrery" generate --checkpoint "$tmp/corrupt" --prompt "hi"

# --- bad configs: one line naming the file and the key.
write_config "$tmp/unknown.toml" "tokens_per_stp = 3"
expect_error "unknown.toml" "$orrery" pretrain --config "$tmp/unknown.toml" --out "$tmp/x1"
expect_error "tokens_per_stp" "$orrery" pretrain --config "$tmp/unknown.toml" --out "$tmp/x1"
write_config "$tmp/zero.toml" "" 128 0
expect_error "stages" "$orrery" pretrain --config "$tmp/zero.toml" --out "$tmp/x2"
expect_error "zero.toml" "$orrery" pretrain --config "$tmp/zero.toml" --out "$tmp/x2"
write_config "$tmp/long.toml" "" 512 1024
sed -i 's/^micro_batch_tokens = 256$/micro_batch_tokens = 512/' "$tmp/long.toml"  # whole rows of 512
expect_error "exceeds the model's max_seq_len 256" "$orrery" pretrain --config "$tmp/long.toml" --out "$tmp/x3"
expect_error "long.toml" "$orrery" pretrain --config "$tmp/long.toml" --out "$tmp/x3"
write_config "$tmp/nodata.toml" "" 128 1024 "no-such-dir"
expect_error "no-such-dir" "$orrery" pretrain --config "$tmp/nodata.toml" --out "$tmp/x4"
expect_error "pretrain.data" "$orrery" pretrain --config "$tmp/nodata.toml" --out "$tmp/x4"
echo "pretrain cli: ok"
