#!/usr/bin/env bash
# Packs GPU test and benchmark binaries built here (-DORRERY_CUDA=ON) for a GPU machine that has
# CUDA but not Debian's OpenBLAS: the binaries, stripped of debug info, and the shared libraries
# they need from this machine (OpenBLAS and its Fortran runtime) in DIR/bundle.tar.xz, which
# scripts/gpu_kda.sh DIR unpacks there. DIR should be ignored by git (.git/info/exclude) and
# named in the device run's `carry`.
#
#   scripts/gpu_bundle.sh DIR BINARY...
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/gpu_bundle.sh DIR BINARY..." >&2
  exit 2
fi
dir=$1
shift
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$dir"
for bin in "$@"; do
  [[ -x "$bin" ]] || { echo "gpu_bundle.sh: $bin: not an executable" >&2; exit 1; }
  strip --strip-debug -o "$stage/$(basename "$bin")" "$bin"
  # The libraries a CUDA image lacks: everything ldd resolves outside the C/C++ runtime, CUDA
  # and NCCL (those come from the GPU machine's own installation).
  ldd "$bin" | awk '$3 ~ /^\// {print $3}' |
    { grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux)[.-]|cuda|nccl' || true; } |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
done
tar -cJf "$dir/bundle.tar.xz" -C "$stage" .
echo "gpu_bundle.sh: $dir/bundle.tar.xz ($(du -h "$dir/bundle.tar.xz" | cut -f1)): $(ls "$stage" | tr '\n' ' ')"
