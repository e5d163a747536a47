"""The records of an actor's metrics.jsonl (one JSON object per line), for the report scripts.

A missing file is no records, and a line that does not parse (the last one, cut by a kill) is
skipped.
"""
import json
import os


def records(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a kill
    return out
