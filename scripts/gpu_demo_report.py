#!/usr/bin/env python3
"""The GPU demo's figures from its run directory (scripts/gpu_demo.sh prints them; docs/benchmarks.md
records them): pass rate per family before and after, wall time by phase, the RL phase's rate,
and how each policy version reached the rollout (the shared buffer's transfer and apply, or the
file), from RUN/summary.json and the actors' metrics (RUN/learner-0/metrics.jsonl,
RUN/rollout-0/metrics.jsonl).

  scripts/gpu_demo_report.py RUN_DIR [--data-seconds S] [--compare ASYNC_RUN SYNC_RUN]
  scripts/gpu_demo_report.py RUN_DIR --check-shared     # exit 1 unless the rollout took versions
                                                          # from the shared buffer (the CPU test)

--compare prints async against sync updates/s and trained tokens/s of two RL-only runs.
"""
import argparse
import json
import os
import statistics
import sys

from metrics_jsonl import records


def median_ms(values):
    return f"{1e3 * statistics.median(values):.2f}" if values else "-"


def pct(r):
    n = r.get("episodes", 0)
    p = r.get("passed", 0)
    return f"{100.0 * p / n:5.1f}% ({p}/{n})" if n else "   -"


def rate(r):
    n = r.get("episodes", 0)
    return r.get("passed", 0) / n if n else 0.0


def learner_rate(run):
    """(updates, seconds, updates/s, trained tokens/s) over the learner's update records."""
    recs = [r for r in records(os.path.join(run, "learner-0", "metrics.jsonl"))
            if "learner/loss" in r["metrics"]]
    if len(recs) < 2:
        return len(recs), 0.0, 0.0, 0.0
    dt = recs[-1]["time"] - recs[0]["time"]
    tokens = recs[-1]["metrics"]["learner/tokens_total"] - recs[0]["metrics"]["learner/tokens_total"]
    return len(recs), dt, (len(recs) - 1) / dt if dt > 0 else 0.0, tokens / dt if dt > 0 else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--data-seconds", type=float, default=None)
    ap.add_argument("--compare", nargs=2, metavar=("ASYNC_RUN", "SYNC_RUN"))
    ap.add_argument("--check-shared", action="store_true")
    a = ap.parse_args()

    rollout = records(os.path.join(a.run, "rollout-0", "metrics.jsonl"))
    shared = [r["metrics"] for r in rollout
              if "rollout/weight_sync_seconds/phase/transfer" in r["metrics"]]
    files = [r["metrics"] for r in rollout if "rollout/weight_load_seconds" in r["metrics"]]
    if a.check_shared:
        print(f"versions from the shared buffer: {len(shared)}, from files: {len(files)}")
        return 0 if shared else 1

    summary_path = os.path.join(a.run, "summary.json")
    if not os.path.exists(summary_path):
        print(f"no {summary_path}: the launch did not reach its summary")
    else:
        s = json.load(open(summary_path))
        before, after = s["before"], s["after"]
        print(f"pass rate on held-out tasks, greedy ({s['updates']} updates, "
              f"{'sync' if s['sync'] else 'async'}):")
        print(f"  {'family':<10} {'before':>16} {'after':>16} {'points':>8}")
        print(f"  {'all':<10} {pct(before):>16} {pct(after):>16} "
              f"{100 * (rate(after) - rate(before)):+8.1f}")
        for fam in sorted(set(before.get("families", {})) | set(after.get("families", {}))):
            b = before.get("families", {}).get(fam, {})
            f = after.get("families", {}).get(fam, {})
            print(f"  {fam:<10} {pct(b):>16} {pct(f):>16} {100 * (rate(f) - rate(b)):+8.1f}")
        print(f"  tool use: {100 * before['tool_call_episode_ratio']:.0f}% -> "
              f"{100 * after['tool_call_episode_ratio']:.0f}% of episodes")
        sec = s["seconds"]
        phases = []
        if a.data_seconds is not None:
            phases.append(("data", a.data_seconds))
        phases += [("pretraining", sec["pretrain"]), ("initial score", sec["eval_before"]),
                   ("RL", sec["rl"]), ("final score", sec["eval_after"])]
        print("wall time by phase: " + ", ".join(f"{n} {v:.0f} s" for n, v in phases) +
              f"; total {sum(v for _, v in phases):.0f} s")

    n, dt, ups, tps = learner_rate(a.run)
    print(f"RL: {n} update records over {dt:.1f} s: {ups:.3f} updates/s, {tps:,.0f} trained tokens/s")
    learner = [r["metrics"] for r in records(os.path.join(a.run, "learner-0", "metrics.jsonl"))
               if "learner/loss" in r["metrics"]]
    phases = ["shared_snapshot", "host_copy", "snapshot", "write"]
    cols = [f"{p} {median_ms([m[f'learner/weight_sync_seconds/phase/{p}'] for m in learner if f'learner/weight_sync_seconds/phase/{p}' in m])}"
            for p in phases]
    print("  learner publication, median ms: " + ", ".join(cols))
    if shared:
        live = [m["rollout/weight_live_seconds"] for m in shared]
        print(f"  rollout, {len(shared)} versions from the shared buffer "
              f"({shared[0]['rollout/weight_shared_bytes'] / 1e6:.1f} MB): median ms transfer "
              f"{median_ms([m['rollout/weight_sync_seconds/phase/transfer'] for m in shared])}, "
              f"apply {median_ms([m['rollout/weight_sync_seconds/phase/apply'] for m in shared])}, "
              f"live {median_ms(live)} (max {1e3 * max(live):.1f})")
    print(f"  rollout, {len(files)} versions from files: median ms load "
          f"{median_ms([m['rollout/weight_load_seconds'] for m in files])}")
    gen = [r["metrics"]["rollout/generation_tokens_per_second"] for r in rollout
           if "rollout/generation_tokens_per_second" in r["metrics"]]
    if gen:
        print(f"  rollout generation: median {statistics.median(gen):,.0f} tokens/s")

    if a.compare:
        rows = []
        for name, run in zip(("async", "sync"), a.compare):
            n, dt, ups, tps = learner_rate(run)
            rows.append((name, n, dt, ups, tps))
            print(f"{name:>5}: {n} updates in {dt:.1f} s: {ups:.3f} updates/s, {tps:,.0f} tokens/s")
        if rows[1][3] > 0:
            print(f"async / sync = {rows[0][3] / rows[1][3]:.2f}x updates/s, "
                  f"{rows[0][4] / rows[1][4]:.2f}x tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
