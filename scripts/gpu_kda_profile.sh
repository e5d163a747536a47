#!/usr/bin/env bash
# Nsight Compute profiles of the tensor-core KDA kernels on a GPU machine: one kernel launch each
# at one shape, the full section set with per-instruction (SASS) sampling, and the resource report
# (registers, shared memory, spills) of every kernel. Everything lands in $OUT/kda_profile.tar.xz
# (the device tool returns at most 8 files) plus a short summary printed last.
#
#   scripts/gpu_kda_profile.sh BIN_DIR [B,T,H,D] [KERNEL_REGEX...]
#
# BIN_DIR as for scripts/gpu_kda.sh (kda_gpu_bench, or a bundle from scripts/gpu_bundle.sh).
# Default shape 8,8192,16,128; default kernels: the forward's chunk prep and state pass, and the
# backward's reverse state pass and chunk kernel. ncu runs with --clock-control none
# (the card's clocks are left as they are).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-kda-out}"
mkdir -p "$out"
bin="${1:?usage: scripts/gpu_kda_profile.sh BIN_DIR [B,T,H,D] [KERNEL_REGEX...]}"
shape="${2:-8,8192,16,128}"
shift $(($# >= 2 ? 2 : $#))
kernels=("$@")
if [[ ${#kernels[@]} -eq 0 ]]; then
  kernels=(KdaChunkPrepKernel KdaStatePassKernel KdaReverseStatePassKernel
    KdaBackwardChunkKernel)
fi
source scripts/gpu_bin_env.sh "$bin" || exit 1
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1 || true)"
[[ -n "$ncu" ]] || { echo "gpu_kda_profile.sh: ncu not found" >&2; exit 1; }
work="$(mktemp -d)"
cuobjdump --dump-resource-usage "$bin/kda_gpu_bench" >"$work/resources.txt" 2>&1 || true
cuobjdump --dump-sass "$bin/kda_gpu_bench" >"$work/sass.txt" 2>&1 || true
for k in "${kernels[@]}"; do
  # The first launch of the kernel (the bench's warm-up), every section, source sampling.
  timeout 240 "$ncu" --clock-control none --set full --import-source yes -k "regex:$k" -c 1 \
    -f -o "$work/$k" "$bin/kda_gpu_bench" --quick --no-decode --shape "$shape" \
    >"$work/$k.ncu.log" 2>&1 || echo "ncu $k failed (see $k.ncu.log)"
  [[ -f "$work/$k.ncu-rep" ]] || continue
  "$ncu" -i "$work/$k.ncu-rep" --page details >"$work/$k.details.txt" 2>&1 || true
  "$ncu" -i "$work/$k.ncu-rep" --page source --csv --print-source sass \
    >"$work/$k.source_sass.csv" 2>&1 || true
  "$ncu" -i "$work/$k.ncu-rep" --page source --csv --print-source cuda \
    >"$work/$k.source_cuda.csv" 2>&1 || true
done
tar -cJf "$out/kda_profile.tar.xz" -C "$work" .
# The summary: duration, issue activity, occupancy and the leading stall reasons per kernel.
for k in "${kernels[@]}"; do
  [[ -f "$work/$k.details.txt" ]] || continue
  echo "== $k"
  grep -E "^ +(Duration|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc Active|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Dynamic Shared Memory Per Block|Executed Instructions |Block Limit Registers|Block Limit Shared Mem) " \
    "$work/$k.details.txt" | sed 's/  */ /g' || true
done
