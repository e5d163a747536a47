#!/usr/bin/env bash
# The orrery CLI: help lists subcommands, version prints, config check reports bad files in one
# line with a non-zero exit and prints resolved values for good ones; bad option values and paths
# that do not exist are one line and a non-zero exit too.
set -uo pipefail
orrery="$1"
src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$orrery" --help | grep -q "config" || fail "--help does not list the config subcommand"
"$orrery" --version | grep -qE "^orrery [0-9]+\.[0-9]+\.[0-9]+" || fail "--version"

printf '[run]\nseed = 3\n\nsed = 4\n' > "$tmp/unknown.toml"
out="$("$orrery" config check "$tmp/unknown.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "unknown key exited 0"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "unknown key printed more than one line: $out"
[ "$out" = "orrery: $tmp/unknown.toml:4: unknown key 'run.sed'" ] || fail "unexpected message: $out"

printf '[run\n' > "$tmp/malformed.toml"
out="$("$orrery" config check "$tmp/malformed.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "malformed TOML exited 0"
case "$out" in "orrery: $tmp/malformed.toml:1: invalid TOML"*) ;; *) fail "malformed: $out" ;; esac

out="$("$orrery" config check "$tmp/missing.toml" 2>&1)"; rc=$?
[ $rc -ne 0 ] || fail "missing file exited 0"
[ "$out" = "orrery: $tmp/missing.toml: config file not found" ] || fail "missing: $out"

out="$("$orrery" config check "$src/configs/run.toml")" || fail "configs/run.toml rejected"
printf '%s\n' "$out" | grep -q '^run.seed = 1234$' || fail "resolved values not printed: $out"

# expect_one_line WHAT PATTERN CMD...: CMD exits non-zero with one line matching PATTERN.
expect_one_line() {
  local what="$1" pattern="$2"
  shift 2
  local out rc
  out="$("$@" 2>&1)"; rc=$?
  [ $rc -ne 0 ] || fail "$what: exited 0: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "$what: more than one line: $out"
  printf '%s\n' "$out" | grep -qE -- "$pattern" || fail "$what: unexpected message: $out"
}

# Paths that do not exist say so.
expect_one_line "missing run" "^orrery: $tmp/none: does not exist " \
  "$orrery" export --run "$tmp/none" --format csv
expect_one_line "missing checkpoint" "^orrery: checkpoint $tmp/none does not exist$" \
  "$orrery" generate --checkpoint "$tmp/none" --prompt hi

# Sandbox pools: sized from [rl.rollout] slots by default; a smaller explicit pool is refused.
mkdir -p "$tmp/ckpt" && echo '{}' > "$tmp/ckpt/trainer.json"
printf '[rl]\ninit = "ckpt"\n[rl.rollout]\nslots = 32\n[env]\nname = "python"\n' > "$tmp/pool.toml"
out="$("$orrery" config check "$tmp/pool.toml")" || fail "pool sized from slots rejected: $out"
printf '%s\n' "$out" | grep -q '^env.python.pool_size = 32  # default$' ||
  fail "pool not sized from the slots: $out"
printf '%s\n[env.python]\npool_size = 16\n' "$(cat "$tmp/pool.toml")" > "$tmp/small_pool.toml"
expect_one_line "pool below the slots" \
  "^orrery: $tmp/small_pool.toml:8: env.python.pool_size: expected at least 32 " \
  "$orrery" config check "$tmp/small_pool.toml"

# [rl] init: unset without [pretrain], or not a checkpoint, is refused by config check (and so
# by launch, before a dashboard or a run directory).
printf '[rl]\nsteps = 2\n' > "$tmp/rl_noinit.toml"
expect_one_line "rl without init" "^orrery: $tmp/rl_noinit.toml:1: rl.init: not set " \
  "$orrery" config check "$tmp/rl_noinit.toml"
printf '[rl]\ninit = "none"\n' > "$tmp/rl_missing.toml"
expect_one_line "rl.init missing" \
  "^orrery: $tmp/rl_missing.toml:2: rl.init: checkpoint $tmp/none does not exist$" \
  "$orrery" config check "$tmp/rl_missing.toml"
expect_one_line "launch with rl.init missing" "rl.init: checkpoint $tmp/none does not exist" \
  "$orrery" launch "$tmp/rl_missing.toml" --dry-run

# Option values: not a number, out of range.
expect_one_line "--max-tokens abc" "^orrery: --max-tokens: expected an integer, got 'abc' " \
  "$orrery" generate --checkpoint "$tmp/none" --prompt hi --max-tokens abc
expect_one_line "--max-tokens -5" "^orrery: generate: --max-tokens -5 is outside \[1, " \
  "$orrery" generate --checkpoint "$tmp/none" --prompt hi --max-tokens -5

# A GPU pretraining config on a machine without a GPU: one line before any data is read. (On a
# GPU machine scripts/gpu_model.sh runs the config itself.)
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
  expect_one_line "gpu pretrain without a gpu" \
    "^orrery: run.device = \"cuda\": no CUDA device is visible to this process" \
    "$orrery" pretrain --config "$src/configs/pretrain/gpu.toml" --out "$tmp/gpu_run"
  [ ! -e "$tmp/gpu_run" ] || fail "gpu pretrain without a gpu made its run directory"
fi

# The RL roles on the GPU: a policy whose model.toml does not load is refused by config check
# (one line naming rl.init), and an RL launch with run.device = "cuda" on a machine without a GPU
# stops with one line before the fleet starts (no run directory).
mkdir -p "$tmp/gate_ck" "$tmp/rl_gpu"
touch "$tmp/gate_ck/trainer.json"
sed 's/^output_gate_rank = 0/output_gate_rank = -8/' "$src/configs/model/tiny.toml" > "$tmp/gate_ck/model.toml"
printf '[run]\ndevice = "cuda"\n[rl]\ninit = "gate_ck"\n' > "$tmp/rl_gate.toml"
expect_one_line "rl on cuda with a model.toml that does not load" \
  "^orrery: $tmp/rl_gate.toml:4: rl.init: run.device = \"cuda\": .*output_gate_rank" \
  "$orrery" config check "$tmp/rl_gate.toml"
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
  ln -s "$src/configs/model" "$tmp/rl_gpu/model"
  sed 's/^seed = 1$/seed = 1\ndevice = "cuda"/' "$src/configs/demo.toml" > "$tmp/rl_gpu/demo.toml"
  expect_one_line "rl launch on cuda without a gpu" \
    "^orrery: $tmp/rl_gpu/demo.toml: run.device = \"cuda\": no CUDA device is visible to this process" \
    "$orrery" launch "$tmp/rl_gpu/demo.toml"
  [ ! -e "$tmp/runs" ] || fail "rl launch on cuda without a gpu made its run directory"
fi

# The GPU demo's config plans on any machine (its data need not exist yet), and on one without a
# GPU its launch stops with one line before anything starts.
out="$("$orrery" launch "$src/configs/demo_gpu.toml" --dry-run 2>&1)" || fail "demo_gpu dry run: $out"
for role in replay:0 rollout:0 learner:0; do
  printf '%s\n' "$out" | grep -q "^$role " || fail "demo_gpu dry run plans no $role: $out"
done
"$orrery" config check "$src/configs/demo_gpu.toml" > /dev/null 2>&1 ||
  fail "configs/demo_gpu.toml rejected: $("$orrery" config check "$src/configs/demo_gpu.toml" 2>&1 | tail -1)"
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
  expect_one_line "the gpu demo without a gpu" \
    "^orrery: .*demo_gpu.toml: run.device = \"cuda\": no CUDA device is visible to this process" \
    "$orrery" launch "$src/configs/demo_gpu.toml"
fi

# The long-context RL run's config (scripts/gpu_long_rl.sh) plans and checks on any machine too.
out="$("$orrery" launch "$src/configs/rl_long_context.toml" --dry-run 2>&1)" ||
  fail "rl_long_context dry run: $out"
for role in replay:0 rollout:0 learner:0; do
  printf '%s\n' "$out" | grep -q "^$role " || fail "rl_long_context dry run plans no $role: $out"
done
"$orrery" config check "$src/configs/rl_long_context.toml" > /dev/null 2>&1 ||
  fail "configs/rl_long_context.toml rejected: $("$orrery" config check "$src/configs/rl_long_context.toml" 2>&1 | tail -1)"

# `source scripts/env.sh` puts the default build's orrery on PATH (README, "Running one test").
if [ "$(realpath "$orrery")" = "$(realpath "$src/build/bin/orrery" 2>/dev/null)" ]; then
  found="$(env -i HOME="$HOME" PATH=/usr/bin:/bin bash -c "source '$src/scripts/env.sh'; command -v orrery")"
  [ "$(realpath "$found" 2>/dev/null)" = "$(realpath "$orrery")" ] ||
    fail "source scripts/env.sh does not put orrery on PATH (found '$found')"
fi

# The dashboard beyond loopback: a token and TLS, each missing one a clear line before binding.
echo "s3cret" > "$tmp/token"
expect_one_line "dashboard beyond loopback without TLS" \
  "^orrery: --bind 0.0.0.0: serving beyond loopback needs --token-file FILE .* --tls-cert FILE --tls-key FILE" \
  "$orrery" dashboard --run "$src/tests/fixtures/metrics_run" --bind 0.0.0.0 --token-file "$tmp/token"
expect_one_line "dashboard with half a TLS pair" "^orrery: --tls-cert and --tls-key: give both" \
  "$orrery" dashboard --run "$src/tests/fixtures/metrics_run" --tls-cert "$tmp/token"
expect_one_line "dashboard with a bad --allow-host" "^orrery: --allow-host 'a b': expected a host name" \
  "$orrery" dashboard --run "$src/tests/fixtures/metrics_run" --allow-host "a b"

echo "cli_test: all checks passed"
