#!/usr/bin/env bash
# The GPU model's Tensor-level ops on a GPU machine: ops_gpu_tests (each op against its CPU twin),
# then, for each that BIN_DIR holds, the CLI check (orrery: scripts/gpu_ops_cli.py) and
# ops_gpu_bench with its PyTorch anchors (scripts/gpu_ops_torch.py) in the same call. Logs under
# $OUT (or ./gpu-ops-out).
#
#   scripts/gpu_ops.sh BIN_DIR
#
# BIN_DIR holds ops_gpu_tests (built elsewhere with CUDA, e.g. build/tests) and in BIN_DIR/lib the
# shared libraries the GPU machine lacks, or all of that packed by scripts/gpu_bundle.sh as
# BIN_DIR/bundle.tar.xz, unpacked here first. cuBLAS/cuBLASLt come from the machine's CUDA
# toolkit or, where the loader does not find them there, from its Python packages (nvidia-*).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-ops-out}"
mkdir -p "$out"
bin="${1:?usage: scripts/gpu_ops.sh BIN_DIR}"
source scripts/gpu_bin_env.sh "$bin" || exit 1
ldd "$bin/ops_gpu_tests" | grep -E 'cublas|cudart|not found' | tee "$out/ldd.txt" || true
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/gpu.txt"
status=0
timeout "${OPS_TEST_TIMEOUT:-300}" "$bin/ops_gpu_tests" 2>&1 | tee "$out/ops_tests.log" || status=1
# `orrery ops run --device cuda` against --device cpu through the CLI, when a CUDA build of orrery
# is there.
if [[ -x "$bin/orrery" ]]; then
  timeout "${OPS_TEST_TIMEOUT:-300}" python3 scripts/gpu_ops_cli.py "$bin/orrery" 2>&1 |
    tee "$out/ops_cli.log" || status=1
fi
if [[ -x "$bin/ops_gpu_bench" ]]; then
  timeout "${OPS_BENCH_TIMEOUT:-200}" "$bin/ops_gpu_bench" 2>&1 | tee "$out/ops_bench.log" ||
    status=1
  timeout "${OPS_BENCH_TIMEOUT:-200}" python3 scripts/gpu_ops_torch.py 2>&1 |
    tee "$out/ops_torch.log" || status=1
fi
grep -E '^\[  (PASSED|FAILED) ' "$out/ops_tests.log" || true
exit $status
