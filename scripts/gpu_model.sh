#!/usr/bin/env bash
# Every GPU check of the GPU model in one device call (issue 22): each GPU test binary BIN_DIR
# holds (ops against their CPU twins, the whole GPU model against the host model, KDA, the
# determinism of the ops and of the training step, and that step again in a second process), the CLI
# checks (`orrery ops run --device cuda` against cpu), the op benchmarks with their PyTorch
# anchors, and, when BIN_DIR holds orrery and DATA_DIR is given, `orrery pretrain` of
# configs/pretrain/gpu.toml stopped part-way and resumed. Logs under $OUT (or ./gpu-model-out).
#
# The PyTorch reference (scripts/gpu_model_torch.py) runs where fla's package is in .fla/ (a copy
# of fla-org/flash-linear-attention's `fla` folder, never committed): the check of the GPU model's
# loss and gradients against it on the weights and batch gpu_model_dump writes (TORCH_CHECK,
# NAME:TOKENS, default small:2048), and its training bench after each Orrery bench of MODEL_BENCH
# (TORCH_BENCH=eager, compile, "eager compile" or "" for none). Triton's compilation and
# autotuning cache goes to TRITON_CACHE_DIR (default $OUT/triton-cache), so a later call can
# carry it back and skip minutes of fla compilation.
#
#   scripts/gpu_model.sh BIN_DIR [DATA_DIR]
#
# BIN_DIR is a directory of binaries built here with CUDA (build/tests, build/bin/orrery) and their
# shared libraries in BIN_DIR/lib, or all of that packed by scripts/gpu_bundle.sh as
# BIN_DIR/bundle.tar.xz. DATA_DIR is a prepared data directory (`orrery data prepare`).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-model-out}"
mkdir -p "$out"
bin="${1:?usage: scripts/gpu_model.sh BIN_DIR [DATA_DIR]}"
data="${2:-}"
source scripts/gpu_bin_env.sh "$bin" || exit 1
export NCCL_NVLS_ENABLE=0
torch_ref=0
if [[ -d .fla/fla ]]; then
  torch_ref=1
  export PYTHONPATH="$PWD/.fla:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1
  export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$(cd "$out" && pwd)/triton-cache}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
status=0
run() {  # NAME TIMEOUT COMMAND...: logs to $out/NAME.log, a failure fails the script
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  [[ $rc -eq 0 ]] || status=1
}
# GPU_TESTS / MODEL_BENCH (below) choose what runs; set either to "" to skip that part (e.g. only
# the pretraining: GPU_TESTS= MODEL_BENCH= scripts/gpu_model.sh BIN_DIR DATA_DIR).
for t in ${GPU_TESTS-ops_gpu_tests seq_ops_gpu_tests attention_gpu_tests moe_gpu_tests \
         gpu_model_tests kda_gpu_tests model_gpu_tests determinism_gpu_tests}; do
  [[ -x "$bin/$t" ]] && run "$t" "${TEST_TIMEOUT:-300}" "$bin/$t"
done
# Determinism across processes: a second process's training steps (GpuDeterminismTest, which
# prints every step's loss sum and gradient norm to 17 digits) must print what the first printed;
# in-process, the cuBLASLt algorithms are pinned, so only a fresh process asks the heuristic again.
if [[ -f "$out/gpu_model_tests.log" ]]; then
  run gpu_model_tests_again "${TEST_TIMEOUT:-300}" "$bin/gpu_model_tests" \
    --gtest_filter='GpuDeterminismTest.*'
  steps() { grep -E '^(bf16|f32) step |^step ' "$1"; }
  if [[ -n "$(steps "$out/gpu_model_tests.log")" ]] &&
     diff <(steps "$out/gpu_model_tests.log") <(steps "$out/gpu_model_tests_again.log") \
       > "$out/cross_process.diff"; then
    echo "cross-process determinism: identical" | tee -a "$out/summary.txt"
  else
    echo "cross-process determinism: DIFFERS (cross_process.diff)" | tee -a "$out/summary.txt"
    status=1
  fi
fi
if [[ -x "$bin/orrery" && -n "${GPU_TESTS-all}" ]]; then
  run ops_cli 300 python3 scripts/gpu_ops_cli.py "$bin/orrery"
fi
if [[ -n "${GPU_TESTS-all}" ]]; then
  [[ -x "$bin/ops_gpu_bench" ]] && run ops_gpu_bench "${BENCH_TIMEOUT:-200}" "$bin/ops_gpu_bench"
  # Attention at (4, 8192, 16) only here; scripts/gpu_attention.sh times issue 23's three shapes.
  [[ -x "$bin/attention_gpu_bench" ]] &&
    run attention_gpu_bench "${BENCH_TIMEOUT:-200}" "$bin/attention_gpu_bench" 4x8192x16
  [[ -x "$bin/ops_gpu_bench" ]] && run ops_torch 200 python3 scripts/gpu_ops_torch.py
  [[ -x "$bin/attention_gpu_bench" ]] &&
    run attention_torch 200 python3 scripts/gpu_attention_torch.py 4x8192x16
fi
# Whole-model training throughput (tokens/s, MFU, peak memory): small at 8 x 4K and 1 x 32K,
# bench-1b at 4 x 4K. MODEL_BENCH="" skips them.
if [[ -x "$bin/gpu_model_bench" ]]; then
  # NAME:SEQ:ROWS[:recompute]
  for spec in ${MODEL_BENCH-small:4096:8 small:32768:1 bench-1b:4096:4}; do
    IFS=: read -r name seq rows mode <<< "$spec"
    run "model_bench_${name}_${seq}x${rows}${mode:+_$mode}" "${BENCH_TIMEOUT:-200}" \
      "$bin/gpu_model_bench" "configs/model/$name.toml" "$seq" "$rows" 5 bf16 "${mode:-keep}"
    if [[ $torch_ref == 1 ]]; then
      for variant in ${TORCH_BENCH-eager}; do
        flags=()
        [[ $variant == compile ]] && flags+=(--compile)
        [[ $mode == recompute ]] && flags+=(--recompute)
        run "torch_bench_${name}_${seq}x${rows}${mode:+_$mode}_$variant" \
          "${TORCH_BENCH_TIMEOUT:-420}" python3 scripts/gpu_model_torch.py bench \
          "configs/model/$name.toml" "$seq" "$rows" "${flags[@]}"
      done
    fi
  done
fi
if [[ $torch_ref == 1 && -x "$bin/gpu_model_dump" ]]; then
  for spec in ${TORCH_CHECK-small:2048}; do
    IFS=: read -r name tokens <<< "$spec"
    dump="$(mktemp -d)"
    run "model_dump_$name" 300 "$bin/gpu_model_dump" "configs/model/$name.toml" "$dump" "$tokens"
    run "torch_check_$name" "${TORCH_CHECK_TIMEOUT:-480}" python3 scripts/gpu_model_torch.py check \
      "configs/model/$name.toml" "$dump" --verbose
    rm -rf "$dump"
  done
fi
if [[ -x "$bin/orrery" && -n "$data" ]]; then
  # Part-way (a checkpoint at step 12, inside the first stage), then resumed to the end.
  rm -rf "$out/pretrain"
  run pretrain_part "${PRETRAIN_TIMEOUT:-400}" "$bin/orrery" pretrain \
    --config configs/pretrain/gpu.toml --data "$data" --out "$out/pretrain" --max-steps 12
  run pretrain_resume "${PRETRAIN_TIMEOUT:-400}" "$bin/orrery" pretrain \
    --config configs/pretrain/gpu.toml --data "$data" --out "$out/pretrain" --resume
  rm -rf "$out/pretrain/checkpoints"/*/optimizer.safetensors  # keep $OUT small
fi
cat "$out/summary.txt"
tar -czf "$out/logs.tar.gz" -C "$out" --exclude logs.tar.gz --exclude pretrain/checkpoints --exclude triton-cache . || true
grep -hE '^\[  (PASSED|FAILED) ' "$out"/*.log || true
exit $status
