#!/usr/bin/env bash
# Long-context prefill on a GPU machine (issue 23 item 3, issue 25 item 5): prefix_attention_gpu_tests
# (PrefixCausalAttention against its CPU twin), gpu_inference_tests (the engine against the host
# model, the MHA-form prefill included), then gpu_long_context_bench (kernels, 8K / 128K / 1M
# prefill and decode of small-1m, the forms' crossover) and its PyTorch anchor
# (scripts/gpu_prefix_attention_torch.py) in the same call. Logs under $OUT (or
# ./gpu-long-context-out).
#
#   scripts/gpu_long_context.sh BIN_DIR [BENCH_ARGS...]
#
# BIN_DIR holds the three binaries (built elsewhere with CUDA, e.g. build/tests) and in
# BIN_DIR/lib the shared libraries the GPU machine lacks, or all of that packed by
# scripts/gpu_bundle.sh as BIN_DIR/bundle.tar.xz, unpacked here first. BENCH_ARGS go to the bench
# (e.g. --no-crossover, --lengths 8192,131072).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-long-context-out}"
mkdir -p "$out"
bin="${1:?usage: scripts/gpu_long_context.sh BIN_DIR [BENCH_ARGS...]}"
shift
source scripts/gpu_bin_env.sh "$bin" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/gpu.txt"
status=0
for t in prefix_attention_gpu_tests gpu_inference_tests; do
  if [[ -x "$bin/$t" ]]; then
    timeout "${TEST_TIMEOUT:-300}" "$bin/$t" 2>&1 | tee "$out/$t.log" || status=1
  fi
done
timeout "${BENCH_TIMEOUT:-420}" "$bin/gpu_long_context_bench" "$@" 2>&1 |
  tee "$out/bench.log" || status=1
timeout 200 python3 scripts/gpu_prefix_attention_torch.py 8 2>&1 | tee "$out/torch.log" ||
  status=1
grep -hE '^\[  (PASSED|FAILED) ' "$out"/*_tests.log || true
exit $status
