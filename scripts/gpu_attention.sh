#!/usr/bin/env bash
# MLA attention on a GPU machine (issue 23): the Hopper primitives' probes, the attention tests
# against the CPU twin (every kernel set), Orrery's timings and cuDNN's in the same run. Writes
# logs under $OUT (or ./gpu-attention-out).
#
#   scripts/gpu_attention.sh BIN_DIR [SHAPE...]
#
# BIN_DIR holds wgmma_probe_gpu_tests, attention_gpu_tests, prefix_attention_gpu_tests (run when
# present) and attention_gpu_bench (built with CUDA, e.g. build/tests) and in BIN_DIR/lib the shared libraries the GPU machine lacks; or all of
# that packed by scripts/gpu_bundle.sh as BIN_DIR/bundle.tar.xz, unpacked here first. SHAPEs
# (4x8192x16, 1x65536x16, 1x8192x128; default all) go to the bench and to
# scripts/gpu_attention_torch.py. Each part runs under a time limit (ATTN_PROBE_TIMEOUT,
# ATTN_TEST_TIMEOUT, ATTN_BENCH_TIMEOUT, ATTN_TORCH_TIMEOUT seconds), in order, so that the logs of
# the parts that finished come back even when one hangs (the kernels' pipelines give up and poison
# their outputs rather than hang, hopper.cuh). Exit status 1 when a part failed.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-attention-out}"
mkdir -p "$out"
if [[ $# -lt 1 ]]; then
  echo "usage: scripts/gpu_attention.sh BIN_DIR [SHAPE...]" >&2
  exit 2
fi
bin="$1"
shift
source scripts/gpu_bin_env.sh "$bin" || exit 1
export OPENBLAS_NUM_THREADS=16 ORRERY_NUM_THREADS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
status=0
# The layers first: a wrong TMA box or wgmma layout fails here with its name.
timeout "${ATTN_PROBE_TIMEOUT:-60}" "$bin/wgmma_probe_gpu_tests" 2>&1 | tee "$out/probe.log" ||
  status=1
timeout "${ATTN_TEST_TIMEOUT:-240}" "$bin/attention_gpu_tests" 2>&1 | tee "$out/tests.log" ||
  status=1
# The prefix-causal forward's bf16 cases (the tensor-core kernels with the prefix row map).
if [[ -x "$bin/prefix_attention_gpu_tests" ]]; then
  timeout "${ATTN_TEST_TIMEOUT:-240}" "$bin/prefix_attention_gpu_tests" \
    --gtest_filter='*bf16*:PrefixAttentionGpuOpTest.*' 2>&1 | tee "$out/prefix_tests.log" ||
    status=1
fi
timeout "${ATTN_BENCH_TIMEOUT:-240}" "$bin/attention_gpu_bench" "$@" 2>&1 |
  tee "$out/bench.log" || status=1
timeout "${ATTN_TORCH_TIMEOUT:-240}" python3 scripts/gpu_attention_torch.py "$@" 2>&1 |
  tee "$out/torch.log" || status=1
exit $status
