"""PNN's alpha x beta grid (the paper's Fig. 4), and the pair chosen on valid (issue 11 (a), (d)).

    python studies/alpha_beta.py studies/alpha-beta-ml1m-full.toml [--out studies/alpha-beta-ml1m-full]

Reads the plan and the finished cells' ``results.json`` of every PNN config that sets both ``alpha``
and ``beta``, and writes to the study's folder:

* ``alpha_beta.png``: two heatmaps, valid NDCG@20 at the best epoch (what the choice uses) and test
  NDCG@20 at that epoch, alpha down and beta across; a cell not finished is blank;
* ``alpha_beta.md``: both grids as tables, the pair with the best valid score, and the first seed's
  DNS and BPR scores beside it.

With several seeds a grid point shows the mean over the seeds it has finished.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pnn_fast.study import load_plan  # noqa: E402

METRIC = "ndcg@20"


def scores(cells, out: Path) -> tuple[float, float, int] | None:
    """(mean valid score at the best epoch, mean test METRIC, seeds) over the finished cells among
    ``cells``; None when none has finished."""
    results = [json.loads(path.read_text()) for path in (cell.folder(out) / "results.json" for cell in cells)
               if path.is_file()]
    if not results:
        return None
    return (float(np.mean([r["best_valid"] for r in results])), float(np.mean([r["test"][METRIC] for r in results])),
            len(results))


def grid_scores(plan, out: Path) -> tuple[list[float], list[float], dict]:
    """(alphas, betas, {(alpha, beta): (valid mean, test mean, seeds)}) of the plan's PNN grid."""
    points = {}
    for cells in plan.groups.values():
        args = cells[0].train_config.loss_args
        if cells[0].train_config.loss == "pnn" and "alpha" in args and "beta" in args:
            points[(float(args["alpha"]), float(args["beta"]))] = scores(cells, out)
    alphas = sorted({a for a, _ in points})
    betas = sorted({b for _, b in points})
    return alphas, betas, points


def baseline_scores(plan, out: Path) -> dict:
    """{config: (valid mean, test mean, seeds)} of the plan's baselines that have finished cells."""
    found = {config: scores(cells, out) for (_, _, config), cells in plan.groups.items() if config in plan.baselines}
    return {config: value for config, value in found.items() if value}


def matrix(alphas, betas, points, which: int) -> np.ndarray:
    """[alphas, betas] of the valid (which 0) or test (1) means; NaN where nothing finished."""
    values = np.full((len(alphas), len(betas)), math.nan)
    for i, a in enumerate(alphas):
        for j, b in enumerate(betas):
            if points.get((a, b)):
                values[i, j] = points[(a, b)][which]
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", help="the study's plan (TOML)")
    parser.add_argument("--out", help="the study's folder (default: the plan's studies/<name>)")
    args = parser.parse_args()
    plan = load_plan(args.plan)
    out = Path(args.out) if args.out else plan.default_out
    alphas, betas, points = grid_scores(plan, out)
    if not points:
        raise SystemExit(f"{args.plan}: no pnn config sets both alpha and beta")
    done = {key: value for key, value in points.items() if value}
    baselines = baseline_scores(plan, out)

    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, which, title in ((axes[0], 0, f"valid {METRIC} (best epoch)"), (axes[1], 1, f"test {METRIC}")):
        values = matrix(alphas, betas, points, which)
        image = ax.imshow(values, cmap="viridis", origin="upper")
        ax.set(xticks=range(len(betas)), xticklabels=[f"{b:g}" for b in betas], xlabel="beta",
               yticks=range(len(alphas)), yticklabels=[f"{a:g}" for a in alphas], ylabel="alpha", title=title)
        for i in range(len(alphas)):
            for j in range(len(betas)):
                if not math.isnan(values[i, j]):
                    ax.text(j, i, f"{values[i, j]:.3f}", ha="center", va="center", fontsize=7, color="white")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"{plan.name}: PNN over alpha x beta ({len(done)} of {len(points)} points finished)")
    fig.tight_layout()
    fig.savefig(out / "alpha_beta.png", dpi=100)
    plt.close(fig)

    lines = [f"# {plan.name}: alpha x beta", "",
             f"`python studies/alpha_beta.py {args.plan}`: {len(done)} of {len(points)} grid points finished "
             f"(mean over the seeds each has finished). Rows alpha, columns beta.", ""]
    for which, label in ((0, f"valid {METRIC} at the best epoch"), (1, f"test {METRIC} at that epoch")):
        values = matrix(alphas, betas, points, which)
        lines += [f"## {label}", "", "| alpha \\ beta | " + " | ".join(f"{b:g}" for b in betas) + " |",
                  "|---|" + "---|" * len(betas)]
        for i, a in enumerate(alphas):
            cells = ["—" if math.isnan(v) else f"{v:.4f}" for v in values[i]]
            lines.append(f"| {a:g} | " + " | ".join(cells) + " |")
        lines.append("")
    if done:
        (a, b), (valid, test, seeds) = max(done.items(), key=lambda item: item[1][0])
        lines += [f"**Chosen on valid** among the finished points: alpha {a:g}, beta {b:g} (valid {valid:.4f}, "
                  f"test {test:.4f}, {seeds} seed{'s' if seeds > 1 else ''})."]
    for name, (valid, test, seeds) in baselines.items():
        lines.append(f"- {name}: valid {valid:.4f}, test {test:.4f} ({seeds} seed{'s' if seeds > 1 else ''})")
    (out / "alpha_beta.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
