#!/usr/bin/env bash
# The tutorial of docs/env.md, "Your first environment", command for command in a copy of the
# repository layout: the environment file the page shows is env/examples/shop/shop_env.py; `env
# try` plays an episode; the data commands and `orrery launch` pretrain for a few seconds and run
# the RL phase on the shop; the dashboard serves the run and `orrery export` lists its rewards.
# usage: env_tutorial_test.sh ORRERY_BINARY SOURCE_DIR
set -euo pipefail
orrery="$1"
src="$2"
tmp="$(mktemp -d)"
dash_pid=""
cleanup() {
  if [ -n "$dash_pid" ]; then kill "$dash_pid" 2>/dev/null || true; wait "$dash_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  [ -f "$tmp/launch.log" ] && tail -30 "$tmp/launch.log" >&2
  exit 1
}
orrery() { "$orrery" "$@"; }  # the page's commands say `orrery` (scripts/env.sh puts it on PATH)

# The page shows the whole environment and its config: they are the example files.
python3 - "$src/docs/env.md" "$src/env/examples/shop" <<'PY' || fail "docs/env.md's tutorial differs from env/examples/shop"
import re, sys
page = open(sys.argv[1]).read()
for lang, name in (("python", "shop_env.py"), ("toml", "shop.toml")):
    blocks = re.findall(r"<!-- " + re.escape(name) + r" -->\n```" + lang + r"\n(.*?)```\n", page, re.S)
    assert len(blocks) == 1, f"{name}: {len(blocks)} blocks marked in the page"
    assert blocks[0] == open(f"{sys.argv[2]}/{name}").read(), f"{name}: the page's copy differs"
PY

# The sandbox runs as an unprivileged uid when Orrery runs as root: it must reach /env's source.
chmod 755 "$tmp"
mkdir -p "$tmp/env/examples"
cp -r "$src/env/examples/shop" "$tmp/env/examples/"
cd "$tmp"

# 2. Try it: play one episode.
printf 'price {"item": "kiwi"}\nprice {"item": "apple"}\nprice {"item": "nut"}\nanswer Answer: 1\n' |
  orrery env try --config env/examples/shop/shop.toml --task-seed 3 > try.txt 2>&1 || fail "env try: $(cat try.txt)"
grep -q '^\[user\] What do 4 kiwi and 4 apple cost?$' try.txt || fail "no question: $(cat try.txt)"
grep -q '^> \[tool, .* ms\] kiwi: [0-9]* cents$' try.txt || fail "no price: $(cat try.txt)"
grep -q "^> \[tool error, .* ms\] error: argument 'item': must be one of" try.txt ||
  fail "a bad item was not refused by the schema: $(cat try.txt)"
grep -q '^  lookups = 2$' try.txt || fail "no score components (the refused call is no lookup): $(cat try.txt)"

# 3. Train on it: a few seconds of pretraining data, then the launch.
mkdir -p runs/shop
orrery env synth --env calc --count 300 --seed 1 --difficulty 1 --out runs/shop/calc.jsonl >/dev/null
orrery tokenizer train --input runs/shop/calc.jsonl --vocab-size 512 --out runs/shop/tokenizer.json >/dev/null
orrery data prepare --tokenizer runs/shop/tokenizer.json --input runs/shop/calc.jsonl \
  --out runs/shop/data --heldout-fraction 0.1 --seed 3 >/dev/null
timeout 120 "$orrery" launch env/examples/shop/shop.toml > launch.log 2>&1 || fail "launch failed"
grep -qE "pass rate +before .* -> after " launch.log || fail "no run summary"
[ -d runs/shop/run/rl/checkpoints/step-00000006 ] || fail "the RL phase did not reach version 6"

# 4. Watch it: the dashboard of the finished run, and its rewards as CSV.
orrery export --run runs/shop/run --format csv > run.csv
grep -q ',rollout:0,[0-9]*,reward/env/shop/mean,' run.csv || fail "no shop reward in the run's metrics"
grep -q ',replay:0,[0-9]*,fleet/state,' run.csv || fail "the replay store is not in the fleet records"
"$orrery" dashboard --run runs/shop/run --port 0 > dash.log 2>&1 &
dash_pid=$!
url=""
for _ in $(seq 1 50); do
  url="$(grep -o 'http://127.0.0.1:[0-9]*/' dash.log | head -1 || true)"
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || fail "the dashboard printed no address: $(cat dash.log)"
python3 - "$url" <<'PY' || fail "the dashboard does not serve the run"
import json, sys, urllib.request
def get(path):
    return json.loads(urllib.request.urlopen(sys.argv[1] + path, timeout=10).read())
series = get("api/series")
assert any(s["name"] == "reward/env/shop/mean" for s in series), series
actors = json.dumps(get("api/actors"))
assert "replay:0" in actors and "rollout:0" in actors, actors
PY
echo "env tutorial: ok"
