# Sourced by the one-call device scripts (scripts/gpu_demo.sh, scripts/gpu_long_rl.sh): the
# steps of a call that must end inside its time limit, each reported in one line. The script sets
# $start (SECONDS at its start), $limit (seconds for the whole call), $out (logs under
# $out/logs) and $summary (the summary file) first, and may set $reserve (seconds kept back at
# each step for what follows; 10 unless set).
#   say TEXT...                  prints TEXT and appends it to $summary
#   left                         seconds left of $limit
#   step NAME LIMIT COMMAND...   runs COMMAND for at most LIMIT seconds and never past the
#                                reserve, output in $out/logs/NAME.log; says its exit status and
#                                time (and its last line when it failed); returns its status, or
#                                124 when no time was left to start it
#   open_bundle BIN_DIR          unpacks BIN_DIR's bundle (scripts/gpu_bin_env.sh, setting $bin),
#                                checks that it has orrery and, unless REQUIRE_GPU=0, that
#                                nvidia-smi sees a GPU (its line in $out/logs/gpu.txt); when one
#                                fails it says why, runs the script's `pack` and exits 1

say() { echo "$*" | tee -a "$summary"; }
left() { echo $((limit - (SECONDS - start))); }
step() {
  local name=$1 want=$2
  shift 2
  local budget=$(( $(left) - ${reserve:-10} ))
  (( budget > want )) && budget=$want
  if (( budget < 5 )); then
    say "$name: skipped (no time left)"
    return 124
  fi
  local t=$SECONDS
  timeout -k 15 "$budget" "$@" > "$out/logs/$name.log" 2>&1
  local rc=$?
  local note=""
  (( rc == 124 || rc == 137 )) && note=" (cut by its $budget s limit)"
  say "$name: exit $rc in $((SECONDS - t)) s$note"
  (( rc == 0 )) || say "  $name's last line: $(tail -1 "$out/logs/$name.log")"
  return $rc
}
open_bundle() {
  if ! source scripts/gpu_bin_env.sh "$1"; then
    say "bundle: cannot open $1 (not a directory, or its bundle.tar.xz does not unpack)"
    pack
    exit 1
  fi
  [[ -x "$bin/orrery" ]] || { say "bundle: no orrery in $bin"; pack; exit 1; }
  export NCCL_NVLS_ENABLE=0
  say "unpacked in $((SECONDS - start)) s"
  if [[ ${REQUIRE_GPU:-1} == 1 ]] &&
     ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
       > "$out/logs/gpu.txt" 2>&1; then
    say "no GPU: nvidia-smi failed ($(head -1 "$out/logs/gpu.txt"))"
    pack
    exit 1
  fi
  say "gpu: $(cat "$out/logs/gpu.txt" 2>/dev/null)"
}
