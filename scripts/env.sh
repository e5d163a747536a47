# Sourced by every script that starts Orrery processes.
#
# OpenBLAS 0.3.21 (Debian 12) misdetects recent Xeons and falls back to its slowest kernels
# (about 7x slower sgemm). The core type must be in the environment before the process starts,
# so the scripts set it here from the CPU's flags unless the caller already chose one.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
export ORRERY_ROOT="${ORRERY_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
# glibc returns every freed block above the mmap threshold to the kernel, so each large tensor
# allocation page-faults and zeroes fresh pages again (about 40% of the CPU model's time). Keep
# freed memory in the heap (blocks up to 32 MB, no trimming below 4 GB) unless the caller chose.
export GLIBC_TUNABLES="${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296}"
# `orrery` on PATH: the default preset's binary (scripts/build.sh default, what demo.sh and
# test.sh build), ahead of any other, unless it is there already.
case ":$PATH:" in
  *":$ORRERY_ROOT/build/bin:"*) ;;
  *) export PATH="$ORRERY_ROOT/build/bin:$PATH" ;;
esac
