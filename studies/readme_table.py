"""The README's results table, made from the confirm studies' committed summary.json files.

    python studies/readme_table.py          # prints the table

tests/test_readme_table.py checks that README.md holds exactly this table, so that the README
cannot drift from the studies' results. Each cell is test NDCG@20, the mean over the study's 5
seeds, with the paired lift over DNS's same seeds; the SL temperature of each dataset is the one
chosen on valid by the screening (docs/why-pnn.md).
"""
from __future__ import annotations

import json
from pathlib import Path

STUDIES = Path(__file__).resolve().parent
METRIC = "ndcg@20"
SEEDS = 5
#: column title -> the study whose summary.json holds it
DATASETS = {"ML-1M (`ml-1m-full`)": "confirm-ml1m-full", "Gowalla": "confirm-gowalla"}
#: (row title, the config of each dataset's study, in DATASETS' order)
ROWS = [
    ("BPR, one uniform negative", ("bpr", "bpr")),
    ("DNS, the hardest of 8 uniform candidates", ("dns", "dns")),
    ("PNN as published (`PNNLoss()`)", ("pnn-paper", "pnn-paper")),
    ("PNN's best form (`PNNLoss.from_preset(\"dns-anchored\", ...)`)", ("pnn-dns-anchored", "pnn-dns-anchored")),
    ("sampled softmax (`SampledSoftmaxLoss`, 800 negatives)", ("sl-t02", "sl-t01")),
]


def groups(study: str) -> dict:
    """config -> its group of the study's summary.json, for the groups with every seed finished."""
    summary = json.loads((STUDIES / study / "summary.json").read_text())
    return {g["config"]: g for g in summary["groups"] if len(g["finished_seeds"]) == SEEDS}


def cell(group: dict, name: str = "") -> str:
    mean = group[METRIC]["mean"]
    if group["config"] == "dns":
        return f"{mean:.4f}"
    lift = group["vs"]["dns"][METRIC]
    label = f", `{name}`" if name else ""
    return f"{mean:.4f} ({lift['paired_lift_percent']:+.1f}%, p {lift['p']:.0e}{label})"


def table() -> str:
    by_study = {title: groups(study) for title, study in DATASETS.items()}
    lines = ["| loss | " + " | ".join(DATASETS) + " |", "|---" * (len(DATASETS) + 1) + "|"]
    for title, configs in ROWS:
        lines.append(f"| {title} | " + " | ".join(cell(by_study[d][c]) for d, c in zip(DATASETS, configs)) + " |")
    best = [max(g.values(), key=lambda g: g[METRIC]["mean"]) for g in by_study.values()]
    lines.append("| the best of every loss run with 5 seeds | " + " | ".join(cell(g, g["config"]) for g in best) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
