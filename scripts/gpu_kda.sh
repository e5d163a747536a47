#!/usr/bin/env bash
# KDA on a GPU machine: the GPU tests against the CPU reference, Orrery's timings, and fla's
# chunk_kda timed in the same run. Writes logs under $OUT (or ./gpu-kda-out).
#
#   scripts/gpu_kda.sh [BIN_DIR [all | orrery | fla]]
#
# BIN_DIR holds kda_gpu_tests and kda_gpu_bench (built elsewhere with -DORRERY_CUDA=ON, e.g.
# build/tests), optionally model_gpu_tests (the model's KDA layer on the GPU) and a CUDA build of
# `orrery` (then scripts/gpu_ops_kda.py runs `orrery ops run --op kda --device cuda`), each run
# when present, and in BIN_DIR/lib the shared libraries the GPU machine lacks; or all of that
# packed by scripts/gpu_bundle.sh as BIN_DIR/bundle.tar.xz, unpacked here first. Without
# BIN_DIR the script builds with the gpu-machine preset first, which needs OpenBLAS on that machine.
# fla is taken from .fla/ (a copy of fla-org/flash-linear-attention's `fla` package, never
# committed) when it is there. Each part runs under a time limit (KDA_TEST_TIMEOUT,
# KDA_BENCH_TIMEOUT, KDA_FLA_TIMEOUT seconds) so that the logs of the parts that finished come back
# even when one hangs (MODEL_TEST_TIMEOUT for model_gpu_tests). fla's Triton compilation and
# autotuning take 4 to more than 5 minutes per shape on a fresh H200 machine (measured in
# sessions 8 and 9: twice it had not finished (8, 8192, 16) after 290-300 s), hence its longer
# default; KDA_FLA_SHAPES="--shape B,T,H,D ..." times only those shapes. FlashKDA's forward (a
# built copy of its `flash_kda` package in .fkda/, never committed) is timed before fla when it
# is there (scripts/gpu_kda_flashkda.py; KDA_FLASHKDA_SHAPES, KDA_FLASHKDA_TIMEOUT).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-kda-out}"
mkdir -p "$out"
bin="${1:-}"
parts="${2:-all}"  # all, orrery (no anchors) or fla (the anchors alone: FlashKDA, then fla)
case "$parts" in
  all | orrery | fla) ;;
  *)
    echo "gpu_kda.sh: parts '$parts': expected all, orrery or fla" >&2
    exit 2
    ;;
esac
if [[ -z "$bin" ]]; then
  cmake --preset gpu-machine >"$out/build.log" 2>&1
  cmake --build --preset gpu-machine --target kda_gpu_tests kda_gpu_bench model_gpu_tests \
    >>"$out/build.log" 2>&1
  bin=build-gpu/tests
elif [[ -f "$bin/bundle.tar.xz" ]]; then
  unpacked="$(mktemp -d)"
  tar -xJf "$bin/bundle.tar.xz" -C "$unpacked"
  bin="$unpacked"
fi
bin="$(cd "$bin" && pwd)"
source scripts/env.sh
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
export OPENBLAS_NUM_THREADS=16 ORRERY_NUM_THREADS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
status=0
if [[ "$parts" != fla ]]; then
  # The tensor-core backward's tests first, each test binary run in its own process so that a
  # fault in one cannot take the others' results with it.
  timeout "${KDA_TEST_TIMEOUT:-150}" "$bin/kda_gpu_tests" --gtest_filter='*TensorCoreBackward*' \
    2>&1 | tee "$out/tests_tc_backward.log" || status=1
  timeout "${KDA_TEST_TIMEOUT:-150}" "$bin/kda_gpu_tests" --gtest_filter='-*TensorCoreBackward*' \
    2>&1 | tee "$out/tests.log" || status=1
  # The model with its KDA core on the GPU against the CPU model, and `ops run --device cuda`.
  if [[ -x "$bin/model_gpu_tests" ]]; then
    timeout "${MODEL_TEST_TIMEOUT:-150}" "$bin/model_gpu_tests" 2>&1 |
      tee "$out/model_gpu_tests.log" || status=1
  fi
  # The CLI itself (a CUDA build of orrery in the bundle; it links NCCL, taken from the
  # machine's pip package when there is one).
  if [[ -x "$bin/orrery" ]]; then
    nccl="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
    LD_LIBRARY_PATH="${nccl:+$nccl/lib:}$LD_LIBRARY_PATH" timeout 120 \
      python3 scripts/gpu_ops_kda.py "$bin/orrery" 2>&1 | tee "$out/ops_run.log" || status=1
  fi
  timeout "${KDA_BENCH_TIMEOUT:-150}" "$bin/kda_gpu_bench" 2>&1 | tee "$out/bench.log" || status=1
fi
if [[ "$parts" != orrery && -d .fkda ]]; then
  PYTHONPATH="$PWD/.fkda:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 timeout "${KDA_FLASHKDA_TIMEOUT:-180}" \
    python3 scripts/gpu_kda_flashkda.py ${KDA_FLASHKDA_SHAPES:+$KDA_FLASHKDA_SHAPES} 2>&1 |
    tee "$out/flashkda.log" || status=1
fi
if [[ "$parts" != orrery && -d .fla ]]; then
  PYTHONPATH="$PWD/.fla:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 timeout "${KDA_FLA_TIMEOUT:-540}" \
    python3 scripts/gpu_kda_fla.py ${KDA_FLA_SHAPES:+$KDA_FLA_SHAPES} 2>&1 | tee "$out/fla.log" ||
    status=1
fi
exit $status
