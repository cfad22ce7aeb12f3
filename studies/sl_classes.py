"""Where PNN's classes fall inside sampled softmax (SL), on trained SL models: why the neutral class
neither adds to SL nor protects it from false negatives (issue 14, hypothesis 6).

    python studies/sl_classes.py studies/confirm-ml1m-full.toml --configs sl-t02,sl-pnn-t02-w05 --seed 4 \
        --out docs/why-pnn/sl-classes-ml1m-full.json
    python studies/sl_classes.py studies/confirm-gowalla.toml --configs sl-t01,sl-pnn-t01-w05 \
        --out docs/why-pnn/sl-classes-gowalla.json

For each finished cell of the named configurations (seed 1 by default) the model at its best valid
epoch is read from the cell's checkpoint (kept beside results.json, never committed). Every user with
a valid item draws SL's ``num_negatives`` uniform unknown items, as in training; the valid split's
items among them are the known false negatives (never the test split). Each row is split as
``--loss sl --loss-arg neutral_weight=...`` splits it: the k lowest-scored draws (PNN's
"proportional" size rule) are the negative class, the rest the neutral class. Reported per cell,
as means over rows:

* ``k``: the negative class's size; ``false_negatives``: valid items among the draws;
* ``negative_class_share_of_false_negatives``: the share of a row's false negatives in its negative
  class, beside ``negative_class_share_of_draws`` (k / K), what a placement blind to them gives;
* ``negative_class_softmax_mass`` and ``false_negative_softmax_mass``: the shares of the denominator's
  negative mass, sum_j exp(s_j / tau), held by the negative class and by the false negatives;
* ``top_share_of_false_negatives`` and ``top_softmax_mass``: the same for each row's ``--top``
  highest-scored draws (``neutral_top``'s neutral class), beside ``top_share_of_draws`` (top / K).

A neutral weight w scales the neutral class's mass by w. Where the negative class holds almost none of
the mass, that scales nearly the whole denominator's negative mass, false negatives and true hard
negatives alike: the same as adding -log w to the positive's logit, not a protection of the false
negatives.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from pnn_fast.backends import reference
from pnn_fast.sampling import sample_unknown
from pnn_fast.study import load_plan
from pnn_fast.train import Trainer, TrainConfig


@torch.no_grad()
def cell_placement(trainer: Trainer, seed: int, batch: int, top: int) -> dict:
    """The means over valid users of the placement statistics above, for the trainer's restored model."""
    args = trainer.objective.args
    draws, temperature = args["num_negatives"], float(args["temperature"])
    user_unit, item_unit = trainer.objective.scoring_tables(trainer.model)
    valid = trainer.held_out["valid"]
    users = torch.nonzero(valid.indptr[1:] > valid.indptr[:-1]).flatten()
    generator = torch.Generator().manual_seed(seed)
    sums = {name: 0.0 for name in ("k", "false_negatives", "negative_class_share_of_draws",
                                   "negative_class_softmax_mass", "false_negative_softmax_mass", "top_softmax_mass")}
    share_of_false_negatives, top_share_of_false_negatives, rows_with_false_negatives = 0.0, 0.0, 0
    for start in range(0, users.numel(), batch):
        rows = users[start:start + batch]
        items = sample_unknown(trainer.known, rows, draws, generator, backend="reference")  # [B, K]
        logits = torch.einsum("bd,bkd->bk", user_unit[rows], item_unit[items]) / temperature
        false_negative = reference.rows_contain(valid, rows, items)  # [B, K] bool
        k = trainer.objective.negative_class_sizes(rows)
        negative = reference.lowest_k_mask(logits, k)  # the k lowest of each row
        highest = reference.lowest_k_mask(-logits, torch.full_like(rows, top))  # the top highest
        mass = torch.softmax(logits, dim=1)  # each draw's share of the row's negative mass
        sums["k"] += k.double().sum().item()
        sums["false_negatives"] += false_negative.double().sum().item()
        sums["negative_class_share_of_draws"] += (k.double() / draws).sum().item()
        sums["negative_class_softmax_mass"] += (mass * negative).sum().item()
        sums["false_negative_softmax_mass"] += (mass * false_negative).sum().item()
        sums["top_softmax_mass"] += (mass * highest).sum().item()
        counted = false_negative.sum(dim=1)
        has = counted > 0
        share_of_false_negatives += ((false_negative & negative).sum(dim=1)[has] / counted[has]).sum().item()
        top_share_of_false_negatives += ((false_negative & highest).sum(dim=1)[has] / counted[has]).sum().item()
        rows_with_false_negatives += int(has.sum())
    means = {name: value / users.numel() for name, value in sums.items()}
    among = rows_with_false_negatives or None  # shares of a row's false negatives: rows that have some
    means["negative_class_share_of_false_negatives"] = among and share_of_false_negatives / among
    means["top_share_of_draws"] = top / draws
    means["top_share_of_false_negatives"] = among and top_share_of_false_negatives / among
    return {"rows": int(users.numel()), "rows_with_false_negatives": rows_with_false_negatives, **means}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="a study plan (TOML) whose SL cells have finished")
    parser.add_argument("--configs", required=True, help="comma-separated config names (loss sl)")
    parser.add_argument("--seed", type=int, default=1, help="the cells' seed, also the draws' (default 1)")
    parser.add_argument("--batch", type=int, default=1024, help="users a batch (default 1024)")
    parser.add_argument("--top", type=int, default=8, help="the highest draws a row to place (default 8)")
    parser.add_argument("--study-folder", type=Path, help="the study's output (default studies/<its name>)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()
    wanted = args.configs.split(",")
    plan = load_plan(args.plan)
    folder_of_study = args.study_folder or plan.default_out
    report = []
    for cell in plan.cells:
        if cell.config not in wanted or cell.seed != args.seed or cell.train_config.loss != "sl":
            continue
        folder = cell.folder(folder_of_study)
        if not (folder / "results.json").exists() or not (folder / "checkpoint.pt").exists():
            print(f"{cell.key}: not finished, or its checkpoint is not kept here: skipped")
            continue
        state = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=False)
        with tempfile.TemporaryDirectory() as scratch:
            trainer = Trainer(cell.dataset.load(), TrainConfig(**dict(state["config"], device="cpu")), scratch)
            trainer.restore(state["best"]["state"])
            placement = cell_placement(trainer, args.seed, args.batch, args.top)
        report.append({"plan": str(args.plan), "cell": cell.key, "best_epoch": state["best"]["epoch"], **placement})
        print(json.dumps(report[-1]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
