#!/usr/bin/env bash
# The grouped expert GEMMs on a GPU machine (issue 24): the wgmma kernel's machine code (HGMMA,
# UTMALDG), grouped_gemm_gpu_tests (every case on mma.sync, then on wgmma with 256- and with
# 128-column tiles, then the fused GLU), moe_gpu_tests when
# BIN_DIR has it (the MoE layer on the default kernel, now wgmma), grouped_gemm_gpu_bench (both
# kernels and the cuBLASLt loop) and its torch._grouped_mm anchor (scripts/gpu_grouped_gemm_torch.py)
# in the same call, and moe_layer_gpu_bench (the whole MoE layer) on the mma kernel and on the
# default when BIN_DIR has it. Logs under $OUT (or ./gpu-grouped-gemm-out): gpu.txt, sass.txt,
# tests.log, moe.log, moe_layer.log, bench.log, torch.log (and sanitize.log with GG_SANITIZE=1).
#
#   scripts/gpu_grouped_gemm.sh BIN_DIR [quick]
#
# BIN_DIR holds grouped_gemm_gpu_tests and grouped_gemm_gpu_bench (optionally moe_gpu_tests and
# moe_layer_gpu_bench), built elsewhere with CUDA (e.g. build/tests), with the libraries the GPU
# machine lacks in BIN_DIR/lib, or all of that packed by scripts/gpu_bundle.sh as
# BIN_DIR/bundle.tar.xz. `quick` times the anchors only (bench and torch). Time limits per part:
# GG_TEST_TIMEOUT (240 s each test binary), GG_BENCH_TIMEOUT (240 s each bench and the anchor).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-grouped-gemm-out}"
mkdir -p "$out"
bin="${1:?usage: scripts/gpu_grouped_gemm.sh BIN_DIR [quick]}"
quick="${2:-}"
source scripts/gpu_bin_env.sh "$bin" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/gpu.txt"
status=0
tlimit="${GG_TEST_TIMEOUT:-240}"
blimit="${GG_BENCH_TIMEOUT:-240}"

# The wgmma kernels' machine code: each WgmmaKernel instantiation should hold HGMMA (wgmma) and
# UTMALDG (TMA loads) instructions; the mma.sync kernels HMMA.
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$bin/grouped_gemm_gpu_tests" 2>/dev/null | awk '
    /Function :/ { fn = $3; wg = (fn ~ /WgmmaKernel/); mm = (fn ~ /RowTilesKernel|WeightGradKernel/) }
    wg && /HGMMA/ { h[fn]++ } wg && /UTMALDG/ { t[fn]++ } wg && /STL|LDL/ { l[fn]++ }
    mm && /HMMA/ { m++ }
    END {
      n = 0
      for (f in h) { n++; printf "%s HGMMA %d UTMALDG %d local-memory %d\n", f, h[f], t[f], l[f] }
      printf "WgmmaKernel instantiations with HGMMA: %d; mma.sync kernels HMMA instructions: %d\n", n, m
    }' | tee "$out/sass.txt" || true
fi

# One process (the CPU twin's results are shared by the kernels' suites); the mma.sync suites
# run first, so their results are in the log even if a wgmma launch fails the process.
timeout "$tlimit" "$bin/grouped_gemm_gpu_tests" >"$out/tests.log" 2>&1 || status=1
for suite in GroupedGemmGpuErrors Mma Wgmma256 Wgmma128 Wgmma/GroupedGemmGlu; do
  ok=$(grep -c "^\[       OK \] $suite" "$out/tests.log" || true)
  bad=$(grep -c "^\[  FAILED  \] $suite" "$out/tests.log" || true)
  echo "$suite: $ok passed, $bad failed"
done
tail -3 "$out/tests.log"
# GG_SANITIZE=1: two small wgmma cases again under compute-sanitizer (out-of-bounds accesses and
# shared-memory races: where a failing wgmma suite needs a closer look).
if [[ "${GG_SANITIZE:-0}" == 1 ]] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout "$tlimit" compute-sanitizer --tool "$tool" "$bin/grouped_gemm_gpu_tests" \
      --gtest_filter='Wgmma*/*E32_N72_K136*:Wgmma*/*E8_F392*' >>"$out/sanitize.log" 2>&1 &&
      echo "compute-sanitizer $tool: ok" || { echo "compute-sanitizer $tool: FAILED"; status=1; }
    tail -3 "$out/sanitize.log"
  done
fi
if [[ -x "$bin/moe_gpu_tests" ]]; then
  timeout "$tlimit" "$bin/moe_gpu_tests" >"$out/moe.log" 2>&1 && echo "moe_gpu_tests: ok" ||
    { echo "moe_gpu_tests: FAILED"; status=1; }
  grep -E '^\[  (PASSED|FAILED) ' "$out/moe.log" || true
fi
# The whole MoE layer (issue 24's layer bench) on the mma kernel, then on the default (wgmma).
if [[ -x "$bin/moe_layer_gpu_bench" ]]; then
  for kernel in mma auto; do
    echo "ORRERY_GROUPED_GEMM=$kernel" | tee -a "$out/moe_layer.log"
    timeout "$blimit" env ORRERY_GROUPED_GEMM="$kernel" "$bin/moe_layer_gpu_bench" 2>&1 |
      tee -a "$out/moe_layer.log" || status=1
  done
fi
bench_env=()
torch_args=()
if [[ "$quick" == quick ]]; then
  bench_env=(ORRERY_BENCH_QUICK=1)
  torch_args=(--quick)
fi
timeout "$blimit" env "${bench_env[@]}" "$bin/grouped_gemm_gpu_bench" 2>&1 | tee "$out/bench.log" ||
  status=1
timeout "$blimit" python3 scripts/gpu_grouped_gemm_torch.py "${torch_args[@]}" 2>&1 |
  tee "$out/torch.log" || status=1
exit $status
