"""Issue 14's bar, read from the studies' summaries: each configuration's paired lift over a baseline
with its 95% confidence interval, and whether the interval clears a lift, or excludes it.

    python studies/intervals.py studies/confirm-*/summary.json studies/screen2-ml100k/summary.json \
        [--baseline dns] [--bar 3] [--metric ndcg@20] [--match 'pnn*' --match 'sl-*']

Prints one markdown table, a row per (study, dataset, model, config) paired with the baseline, in the
summaries' order: the paired lift over the seeds both finished, on which the interval is centred.
``clears`` means the whole interval lies at or above ``--bar`` percent; ``excluded`` that it lies
below it, so that the seeds rule such a lift out (at 95%); ``open`` otherwise. The intervals are
``pnn_fast.study``'s (Student's t over the seeds both finished, in % of the baseline's mean over
them); rows with fewer than two pairs are skipped.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
from pathlib import Path


def verdict(interval: list, bar: float) -> str:
    low, high = interval
    if low >= bar:
        return "clears"
    return "excluded" if high < bar else "open"


def rows(summary: dict, baseline: str, metric: str, patterns: list) -> list:
    out = []
    for group in summary["groups"]:
        comparison = group["vs"].get(baseline, {}).get(metric)
        if comparison is None or comparison.get("ci95_percent") is None:
            continue
        if patterns and not any(fnmatch.fnmatch(group["config"], p) for p in patterns):
            continue
        out.append((summary["study"], group, comparison))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="summary.json files written by pnn-fast study")
    parser.add_argument("--baseline", default="dns")
    parser.add_argument("--bar", type=float, default=3.0, help="the lift in %% that a configuration must clear")
    parser.add_argument("--metric", default="ndcg@20")
    parser.add_argument("--match", action="append", default=[], help="config names to keep (glob; repeatable)")
    args = parser.parse_args(argv)
    print(f"| study | dataset · model | config | seeds | {args.metric} vs {args.baseline} | 95% CI | p "
          f"| a {args.bar:g}% lift |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.summaries:
        try:
            summary = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise SystemExit(f"{path}: cannot read a study summary ({err})") from None
        for study, group, c in rows(summary, args.baseline, args.metric, args.match):
            low, high = c["ci95_percent"]
            p = "—" if c["p"] is None else f"{c['p']:.2g}"
            print(f"| {study} | {group['dataset']} · {group['model']} | {group['config']} | {c['pairs']} "
                  f"| {c['paired_lift_percent']:+.2f}% | [{low:+.2f}%, {high:+.2f}%] | {p} "
                  f"| {verdict(c['ci95_percent'], args.bar)} |")


if __name__ == "__main__":
    main()
