#!/usr/bin/env python3
"""The long-context RL run's figures (configs/rl_long_context.toml; scripts/gpu_long_rl.sh prints
them, tests/integration/rl_long_context_test.sh checks them on the CPU): episode lengths, truncated
episodes by the limit that ended them, rollout tokens/s (every fed token: the prompts' prefill and
the decodes; and generated tokens alone), learner tokens/s per update, the longest sequence
trained, and each role's peak device memory (the CUDA caching allocator's, so only on the GPU),
from RUN/rollout-*/metrics.jsonl and RUN/learner-0/metrics.jsonl.

  scripts/long_rl_report.py RUN_DIR [--check-updates N] [--check-min-length TOKENS]

With --check-* it exits 1, naming what failed, unless the learner made at least N updates, no
episode was cut by the context (rollout/truncated_context_total = 0), and the shortest episode
was at least TOKENS long.
"""
import argparse
import glob
import os
import sys

from metrics_jsonl import records


def gib(b):
    return f"{b / 2**30:.1f} GiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--check-updates", type=int, default=None)
    ap.add_argument("--check-min-length", type=int, default=None)
    a = ap.parse_args()

    rollout = []
    for path in sorted(glob.glob(os.path.join(a.run, "rollout-*", "metrics.jsonl"))):
        rollout.append([r["metrics"] for r in records(path)])
    groups = [m for recs in rollout for m in recs if "rollout/episode_length_tokens" in m]
    learner = [r["metrics"] for r in records(os.path.join(a.run, "learner-0", "metrics.jsonl"))
               if "learner/loss" in r["metrics"]]
    problems = []

    print(f"long-context RL run {a.run}")
    if groups:
        lo = min(m["rollout/episode_length_tokens_min"] for m in groups)
        hi = max(m["rollout/episode_length_tokens_max"] for m in groups)
        mean = sum(m["rollout/episode_length_tokens"] for m in groups) / len(groups)
        print(f"  episodes: {len(groups)} groups, length {lo:.0f} .. {hi:.0f} tokens "
              f"(mean of group means {mean:.0f}), pass rate "
              f"{sum(m.get('reward/pass_rate', 0) for m in groups) / len(groups):.1%}")
        fed = [m["rollout/fed_tokens_per_second"] for m in groups
               if "rollout/fed_tokens_per_second" in m]
        gen = [m["rollout/generation_tokens_per_second"] for m in groups
               if "rollout/generation_tokens_per_second" in m]
        if fed:
            print(f"  rollout: {sum(fed) / len(fed):,.0f} fed tokens/s (prefill and decode, mean "
                  f"over groups; max {max(fed):,.0f}), {sum(gen) / max(len(gen), 1):,.1f} "
                  "generated tokens/s")
        if a.check_min_length is not None and lo < a.check_min_length:
            problems.append(f"shortest episode {lo:.0f} tokens < {a.check_min_length}")
    else:
        print("  episodes: none reported")
        problems.append("no rollout group reported")
    last = {}
    for recs in rollout:
        for m in recs:
            for k in ("rollout/truncated_context_total", "rollout/truncated_turn_tokens_total",
                      "rollout/truncated_turns_total", "rollout/env_tool_errors_total",
                      "rollout/device_peak_bytes", "rollout/device_reserved_bytes"):
                if k in m:
                    last[k] = max(last.get(k, 0), m[k])
    print("  truncated episodes: {:.0f} by the context (max_episode_tokens), {:.0f} by "
          "max_turn_tokens, {:.0f} by max_turns; {:.0f} ended by an environment fault".format(
              last.get("rollout/truncated_context_total", 0),
              last.get("rollout/truncated_turn_tokens_total", 0),
              last.get("rollout/truncated_turns_total", 0),
              last.get("rollout/env_tool_errors_total", 0)))
    if last.get("rollout/truncated_context_total", 0) > 0:
        problems.append(f"{last['rollout/truncated_context_total']:.0f} episodes cut by the context")
    if "rollout/device_peak_bytes" in last:
        print(f"  rollout device memory: peak {gib(last['rollout/device_peak_bytes'])} in use, "
              f"{gib(last['rollout/device_reserved_bytes'])} held by its allocator at the end")
    for m in learner:
        line = (f"  update {m.get('learner/samples', 0):.0f} samples, "
                f"{m.get('learner/max_sample_tokens', 0):,.0f} tokens longest, "
                f"{m.get('learner/update_seconds', 0):.2f} s, "
                f"{m.get('learner/tokens_per_second', 0):,.0f} tokens/s")
        if "learner/device_peak_bytes" in m:
            line += f", device peak {gib(m['learner/device_peak_bytes'])}"
        print(line)
    if learner:
        tok = sum(m.get("learner/tokens_per_second", 0) * m.get("learner/update_seconds", 0)
                  for m in learner)
        sec = sum(m.get("learner/update_seconds", 0) for m in learner)
        print(f"  learner: {len(learner)} updates, {tok:,.0f} tokens in {sec:.1f} s of updates "
              f"({tok / sec if sec > 0 else 0:,.0f} tokens/s), longest sequence "
              f"{max(m.get('learner/max_sample_tokens', 0) for m in learner):,.0f} tokens")
        peaks = [m["learner/device_peak_bytes"] for m in learner if "learner/device_peak_bytes" in m]
        if peaks:
            print(f"  learner device memory: peak {gib(max(peaks))} in use")
    else:
        print("  learner: no update reported")
    if a.check_updates is not None and len(learner) < a.check_updates:
        problems.append(f"{len(learner)} updates < {a.check_updates}")
    if a.check_updates is not None or a.check_min_length is not None:
        for p in problems:
            print(f"CHECK FAILED: {p}")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
