#!/usr/bin/env python3
"""Writes a variant of a run config: keys set, sections dropped, the rest of the file as it is
(comments included). Used by scripts/gpu_demo.sh (the async/sync comparison's RL-only runs) and
by tests/integration/demo_gpu_test.sh (configs/demo_gpu.toml on the CPU, at a tiny budget), so
that both run the real config file, changed only where they say.

  scripts/toml_override.py IN OUT [--drop SECTION]... [SECTION.KEY=VALUE]...

SECTION is a table name as written in its header ("run", "rl.rollout", "stages" for every
[[stages]] entry); VALUE is TOML text ("\"cpu\"", "3", "[2, 3]"). A key is replaced where the
section has it and appended to the section (its first entry, for an array of tables) where it
does not; a section the file lacks is an error, as is a key set twice.
"""
import re
import sys

HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-]+)\s*\]\]?\s*(#.*)?$")
KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+)\s*=")


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, rest = argv[1], argv[2], argv[3:]
    drop, sets = set(), {}
    i = 0
    while i < len(rest):
        if rest[i] == "--drop":
            drop.add(rest[i + 1])
            i += 2
            continue
        key, eq, value = rest[i].partition("=")
        section, _, name = key.rpartition(".")
        if not eq or not section or not name:
            print(f"toml_override.py: '{rest[i]}': expected SECTION.KEY=VALUE", file=sys.stderr)
            return 2
        if (section, name) in sets:
            print(f"toml_override.py: {key} set twice", file=sys.stderr)
            return 2
        sets[(section, name)] = value
        i += 1
    out, section, seen_sections, done = [], None, set(), set()

    def flush(sec):
        # Keys of `sec` not found in it: appended at the end of its (first) entry.
        for (s, name), value in sets.items():
            if s == sec and (s, name) not in done:
                out.append(f"{name} = {value}\n")
                done.add((s, name))

    for line in open(src):
        m = HEADER.match(line)
        if m:
            if section is not None and section not in drop:
                flush(section)
            section = m.group(1)
            seen_sections.add(section)
            if section in drop:
                continue
            out.append(line)
            continue
        if section in drop:
            continue
        k = KEY.match(line)
        if k and (section, k.group(1)) in sets:
            out.append(f"{k.group(1)} = {sets[(section, k.group(1))]}\n")
            done.add((section, k.group(1)))
            continue
        out.append(line)
    if section is not None and section not in drop:
        flush(section)
    missing = [f"{s}.{n}" for (s, n) in sets if s not in seen_sections]
    for s in drop - seen_sections:
        missing.append(f"[{s}]")
    if missing:
        print(f"toml_override.py: {src} has no section for {', '.join(missing)}", file=sys.stderr)
        return 1
    with open(dst, "w") as f:
        f.writelines(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
