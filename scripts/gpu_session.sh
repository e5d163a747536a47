#!/usr/bin/env bash
# One device call that runs a session's GPU checks: every GPU test binary of the bundle
# (*gpu*_tests), a few at a time, then each line of a plan file alone, in order, within a
# deadline — so that a session with 30 minutes of device time spends it in few, full calls. Logs
# go under $OUT/logs (packed as $OUT/logs.tar.xz); $OUT/summary.txt has one line per test binary
# (exit status, seconds, tests passed and failed) and per plan line, and $OUT/failures.txt the
# failed tests' messages.
#
#   scripts/gpu_session.sh BIN_DIR [PLAN]
#
# BIN_DIR: the binaries, or the directory of their scripts/gpu_bundle.sh bundle (carried to the
# device machine). PLAN: a file of shell command lines (blank lines and # comments skipped), each
# run with $bin set to the unpacked binaries and $OUT to its own folder $OUT/plan_N; a line that
# would start with fewer than 20 s left is skipped and said so. Environment:
#   TESTS         test binaries to run (default: every *gpu*_tests in the bundle); "" for none
#   PAR           test binaries at once (default 4; each gets ORRERY_NUM_THREADS=4)
#   TEST_TIMEOUT  seconds per test binary (default 240)
#   DEADLINE      seconds for the whole call (default 560, under the device's 600 s per command)
# Exits 0 when every test binary and plan line exited 0, else 1.
set -uo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: scripts/gpu_session.sh BIN_DIR [PLAN]" >&2
  exit 2
fi
cd "$(dirname "$0")/.." || exit 2
plan="${2:-}"
if [[ -n "$plan" && ! -f "$plan" ]]; then
  echo "gpu_session.sh: plan $plan: no such file" >&2
  exit 2
fi
source scripts/gpu_bin_env.sh "$1" || exit 2
export bin NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
start=$SECONDS
deadline=${DEADLINE:-560}
out="${OUT:-/tmp/gpu_session}"
logs="$out/logs"
summary="$out/summary.txt"
mkdir -p "$logs"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > "$summary" 2>&1
failed=0

if [[ -z "${TESTS+set}" ]]; then
  TESTS="$(cd "$bin" && ls -- *gpu*_tests 2>/dev/null | tr '\n' ' ')"
fi
run_test() {  # NAME: one test binary; its result line into $logs/NAME.result
  local t=$1 s=$SECONDS
  OPENBLAS_NUM_THREADS=4 ORRERY_NUM_THREADS=4 timeout "${TEST_TIMEOUT:-240}" "$bin/$t" \
    > "$logs/$t.log" 2>&1
  local rc=$?
  local ok bad
  ok=$(grep -cE '^\[       OK \]' "$logs/$t.log")
  bad=$(grep -E '^\[  FAILED  \]' "$logs/$t.log" | grep -vc 'listed below')
  echo "$rc $t: rc $rc in $((SECONDS - s)) s; $ok ok, $bad failed" > "$logs/$t.result"
}
i=0
for t in $TESTS; do
  if [[ ! -x "$bin/$t" ]]; then
    echo "1 $t: not in the bundle" > "$logs/$t.result"
    continue
  fi
  run_test "$t" &
  i=$((i + 1))
  if ((i % ${PAR:-4} == 0)); then wait; fi
done
wait
for t in $TESTS; do
  read -r rc line < "$logs/$t.result"
  echo "$line" >> "$summary"
  ((rc == 0)) || failed=1
done
echo "tests done at $((SECONDS - start)) s" >> "$summary"
grep -h -B1 -A6 'Failure$\|^\[  FAILED  \]' "$logs"/*.log 2>/dev/null | head -200 \
  > "$out/failures.txt"

n=0
if [[ -n "$plan" ]]; then
  while IFS= read -r line || [[ -n "$line" ]]; do
    [[ -z "${line// /}" || "$line" =~ ^[[:space:]]*# ]] && continue
    n=$((n + 1))
    left=$((deadline - (SECONDS - start)))
    if ((left < 20)); then
      echo "plan $n skipped ($left s left): $line" >> "$summary"
      failed=1
      continue
    fi
    s=$SECONDS
    mkdir -p "$out/plan_$n"
    echo "== $line" > "$logs/plan_$n.log"
    OUT="$out/plan_$n" timeout "$left" bash -c "$line" >> "$logs/plan_$n.log" 2>&1
    rc=$?
    echo "plan $n: rc $rc in $((SECONDS - s)) s: $line" >> "$summary"
    ((rc == 0)) || failed=1
  done < "$plan"
fi

echo "total $((SECONDS - start)) s" >> "$summary"
tar -cJf "$out/logs.tar.xz" -C "$out" logs
cat "$summary"
exit $failed
