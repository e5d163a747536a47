# Sourced by the GPU run scripts: `source scripts/gpu_bin_env.sh BIN_DIR` makes $bin the absolute
# directory of the binaries — BIN_DIR itself, or BIN_DIR/bundle.tar.xz (scripts/gpu_bundle.sh)
# unpacked into a temporary directory — sources scripts/env.sh, and puts the bundle's libraries
# first on LD_LIBRARY_PATH and the CUDA libraries of the machine's Python packages (cuBLAS,
# cuDNN, NCCL under site-packages/nvidia/*/lib) last. Returns non-zero with one line when BIN_DIR
# is not a directory or its bundle does not unpack.
bin="$1"
if [[ -f "$bin/bundle.tar.xz" ]]; then
  unpacked="$(mktemp -d)"
  tar -xJf "$bin/bundle.tar.xz" -C "$unpacked" || {
    echo "gpu_bin_env.sh: cannot unpack $bin/bundle.tar.xz" >&2
    return 1
  }
  bin="$unpacked"
fi
bin="$(cd "$bin" 2> /dev/null && pwd)" || {
  echo "gpu_bin_env.sh: $1: no such directory" >&2
  return 1
}
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
pylibs="$(python3 -c 'import glob, site; print(":".join(d for p in site.getsitepackages()
  for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}${pylibs:+:$pylibs}"
