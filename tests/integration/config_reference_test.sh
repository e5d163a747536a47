#!/usr/bin/env bash
# docs/config-reference.md is what the config readers read: regenerated and compared. A reader's
# new key needs its line in docs/config-keys.toml (else `orrery config keys` fails naming it),
# then: orrery config keys --format md > docs/config-reference.md
# usage: config_reference_test.sh ORRERY_BINARY SOURCE_DIR
set -euo pipefail
orrery="$1"
src="$2"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
"$orrery" config keys --format md > "$out"
if ! diff -u "$src/docs/config-reference.md" "$out"; then
  echo "FAIL: docs/config-reference.md is not what the readers read; regenerate it with" >&2
  echo "  build/bin/orrery config keys --format md > docs/config-reference.md" >&2
  exit 1
fi
# Every section the reference covers at least.
for table in '### \[run\]' '### \[fleet\]' '### \[\[fleet.roles\]\]' '### \[replay\]' \
    '### \[\[replay.tables\]\]' '### \[env\]' '### \[env.python\]' '### \[env.external\]' \
    '### \[\[env.mcp\]\]' '### \[rl\]' '### \[rl.rollout\]' '### \[rl.learner\]' \
    '### \[pretrain\]' '### \[optimizer\]' '### \[\[stages\]\]' '### \[model\]' '### \[model.kda\]' \
    '### \[model.mla\]' '### \[model.moe\]' '### \[model.attn_res\]'; do
  grep -q "^$table\$" "$out" || { echo "FAIL: no table $table in the reference" >&2; exit 1; }
done
echo "config reference: ok"
