#!/usr/bin/env bash
# `orrery env synth|list|try` end to end: real binary, real files, one-line errors.
# usage: env_cli_test.sh ORRERY_BINARY SOURCE_DIR
set -euo pipefail
orrery="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# synth: N lines of {"messages": [...]}, deterministic in the seed.
"$orrery" env synth --env calc --count 50 --seed 7 --out "$tmp/a.jsonl" >/dev/null
"$orrery" env synth --env calc --count 50 --seed 7 --out "$tmp/b.jsonl" >/dev/null
[ "$(wc -l < "$tmp/a.jsonl")" -eq 50 ] || fail "synth wrote the wrong number of lines"
cmp -s "$tmp/a.jsonl" "$tmp/b.jsonl" || fail "synth is not deterministic"
python3 - "$tmp/a.jsonl" <<'PY' || fail "synth output is not the documented format"
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)["messages"]
    assert m[0]["role"] == "system" and m[1]["role"] == "user" and m[-1]["role"] == "assistant"
    assert m[-1]["content"].split("\n")[-1].startswith("Answer: ")
PY
# Bad input: one line on stderr, non-zero exit.
if "$orrery" env synth --env calc --count 0 --out "$tmp/c.jsonl" 2>"$tmp/err"; then fail "count 0 accepted"; fi
[ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "error is not one line: $(cat "$tmp/err")"
grep -q -- "--count 0 is outside" "$tmp/err" || fail "unclear error: $(cat "$tmp/err")"

# list
"$orrery" env list | grep -q "^calc " || fail "env list lacks calc"

# try: play a calc episode through stdin; the right answer earns reward 1.
"$orrery" env try --env calc --task-seed 2 < /dev/null > "$tmp/q.txt" 2>&1 || true
expr="$(python3 -c '
import re, sys
for line in open(sys.argv[1]):
    if line.startswith("[user] "):
        print(re.search(r"[0-9(][0-9+*/(). -]*[0-9)]", line).group(0)); break' "$tmp/q.txt")"
[ -n "$expr" ] || fail "no question printed: $(cat "$tmp/q.txt")"
printf 'calculate {"expression": "%s"}\nnot_a_tool {}\n' "$expr" |
  "$orrery" env try --env calc --task-seed 2 > "$tmp/t1.txt" 2>&1 || true
value="$(sed -n 's/^> \[tool, [0-9.]* ms\] \(.*\)$/\1/p' "$tmp/t1.txt" | head -1)"
[ -n "$value" ] || fail "calculate gave no result: $(cat "$tmp/t1.txt")"
grep -q "error: unknown tool 'not_a_tool' (available: calculate)" "$tmp/t1.txt" || fail "unknown tool not reported"
printf 'calculate {"expression": "%s"}\nanswer Answer: %s\n' "$expr" "$value" |
  "$orrery" env try --env calc --task-seed 2 > "$tmp/t2.txt" 2>&1 || fail "try failed: $(cat "$tmp/t2.txt")"
grep -q "^> reward 1$" "$tmp/t2.txt" || fail "right answer not rewarded: $(cat "$tmp/t2.txt")"
printf 'answer Answer: 0.000001\n' | "$orrery" env try --env calc --task-seed 2 > "$tmp/t3.txt" 2>&1
grep -q "^> reward 0$" "$tmp/t3.txt" || fail "wrong answer rewarded: $(cat "$tmp/t3.txt")"
if "$orrery" env try --env calc --task-seed -3 </dev/null >"$tmp/out" 2>"$tmp/err"; then
  fail "--task-seed -3 accepted"
fi
[ "$(wc -l < "$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ] ||
  fail "not one line: $(cat "$tmp/out" "$tmp/err")"
grep -q -- "--task-seed -3 is negative" "$tmp/err" || fail "unclear error: $(cat "$tmp/err")"
if "$orrery" env try --env nope 2>"$tmp/err"; then fail "unknown env accepted"; fi
grep -q "unknown environment 'nope'" "$tmp/err" || fail "unclear error: $(cat "$tmp/err")"
# config check validates [env] strictly.
printf '[env]\nname = "calc"\n[env.calc]\ndifficulty = 2\n' > "$tmp/ok.toml"
"$orrery" config check "$tmp/ok.toml" >/dev/null || fail "valid [env] rejected"
printf '[env]\nname = "calc"\n[env.calc]\ndifficultty = 2\n' > "$tmp/bad.toml"
if "$orrery" config check "$tmp/bad.toml" 2>"$tmp/err"; then fail "typo in [env.calc] accepted"; fi
grep -q "env.calc.difficultty" "$tmp/err" || fail "unclear error: $(cat "$tmp/err")"
# A plug-in that does not load: env try says so (it said "unknown key 'env.name'"), in one line.
printf '[env]\nname = "countdown"\nplugins = ["%s/none.so"]\n' "$tmp" > "$tmp/plugin.toml"
if "$orrery" env try --config "$tmp/plugin.toml" </dev/null >"$tmp/out" 2>"$tmp/err"; then
  fail "a missing plug-in accepted"
fi
[ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "not one line: $(cat "$tmp/err")"
grep -q "^orrery: env try: env plug-in $tmp/none.so: cannot load: " "$tmp/err" ||
  fail "unclear error: $(cat "$tmp/err")"
# A whole run's config will do for env try (its other sections are validated, not refused).
printf '[run]\nseed = 2\n[env]\nname = "calc"\n' > "$tmp/run.toml"
echo quit | "$orrery" env try --config "$tmp/run.toml" > "$tmp/out" 2>&1 || true
grep -q "^task calc/train/" "$tmp/out" || fail "env try refused a run config: $(cat "$tmp/out")"
echo "env cli: ok"
