#!/usr/bin/env bash
# The GPU decode step on a GPU machine (issue 25, item 2): its tests, then gpu_decode_bench for
# `small` and `bench-1b`. Writes logs under $OUT (or ./gpu-decode-out).
#
#   scripts/gpu_decode.sh BIN_DIR
#
# BIN_DIR holds gpu_inference_tests, kda_gpu_tests, seq_ops_gpu_tests, ops_gpu_tests and
# gpu_decode_bench (built elsewhere with -DORRERY_CUDA=ON), optionally gpu_model_tests (the
# training path on the device's one stream: every op it shares with the decode step moved off the
# legacy stream), and in BIN_DIR/lib the shared libraries
# the GPU machine lacks, or all of that packed by scripts/gpu_bundle.sh as BIN_DIR/bundle.tar.xz,
# unpacked here first. Each part runs under a time limit (DECODE_TEST_TIMEOUT, DECODE_BENCH_TIMEOUT
# seconds) so that the logs of the parts that finished come back even when one hangs.
# DECODE_CONTEXT (4096) and DECODE_BATCHES ("1 16 64 256") set the bench's shape; DECODE_CONFIGS
# ("small bench-1b") its models. Exits non-zero when a test or a bench failed.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-decode-out}"
mkdir -p "$out"
bin="${1:?usage: scripts/gpu_decode.sh BIN_DIR}"
source scripts/gpu_bin_env.sh "$bin" || exit 1
export OPENBLAS_NUM_THREADS=16 ORRERY_NUM_THREADS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
status=0
t="${DECODE_TEST_TIMEOUT:-150}"
# The ops against their CPU twins (all of them: the stream moved under every op), the engine,
# then the training path (each binary its own process).
timeout "$t" "$bin/kda_gpu_tests" 2>&1 | tee "$out/kda.log" || status=1
timeout "$t" "$bin/seq_ops_gpu_tests" 2>&1 | tee "$out/seq_ops.log" || status=1
timeout "$t" "$bin/ops_gpu_tests" 2>&1 | tee "$out/ops.log" || status=1
timeout "$t" "$bin/gpu_inference_tests" 2>&1 | tee "$out/inference.log" || status=1
if [[ -x "$bin/gpu_model_tests" ]]; then
  timeout "$t" "$bin/gpu_model_tests" 2>&1 | tee "$out/model.log" || status=1
fi
for config in ${DECODE_CONFIGS:-small bench-1b}; do
  # shellcheck disable=SC2086  # the batch sizes are separate arguments
  timeout "${DECODE_BENCH_TIMEOUT:-240}" "$bin/gpu_decode_bench" "configs/model/$config.toml" \
    "${DECODE_CONTEXT:-4096}" bf16 ${DECODE_BATCHES:-1 16 64 256} 2>&1 |
    tee "$out/bench_$config.log" || status=1
done
exit "$status"
