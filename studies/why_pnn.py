"""Why PNN does or does not beat DNS: diagnostics beyond the paper (issue 14), one command.

    python studies/why_pnn.py --data ../shared/data/ml-100k --epochs 30 --out docs/why-pnn

Trains MF with DNS (hardest of 8 uniform) and with PNN configurations, and after every epoch
measures on a fixed sample of training batches, using the *valid* split's positives as the known
false negatives (never the test split):

* where false negatives land: of the candidates that are a held-out positive of the row's user,
  the share put in the negative class, the neutral class, and chosen as the hard negative; beside
  the share of all unlabeled candidates in each, which is what a placement blind to them gives;
* lambda per row (the attention's), as a histogram per epoch;
* each term's share of the gradient norm on the item table: (1 - lambda) L_BPR, lambda L_rank,
  lambda alpha L_constrain and lambda beta L_uniform, each differentiated alone.

Writes ``diagnostics.json`` (updating the configurations it ran, keeping the others already
there) and the PNGs to ``--out``.

With ``--hide-train-share 0.1`` (the paper's Fig. 3 setting, ``load_dataset``'s option) a random
10% of each user's training pairs is hidden from training, and those hidden pairs, not the valid
split, are the known false negatives whose placement is measured: where PNN puts real positives it
was never told about.

    python studies/why_pnn.py --data ../shared/data/ml-100k --epochs 30 --hide-train-share 0.1 \
        --configs dns,pnn-paper,pnn-dns-anchored --out docs/why-pnn/false-negatives
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from pnn_fast.backends import reference  # noqa: E402
from pnn_fast.backends.rows import gather_rows, negative_class_size  # noqa: E402
from pnn_fast.data import load_dataset  # noqa: E402
from pnn_fast.known import KnownPositives  # noqa: E402
from pnn_fast.sampling import sample_unknown  # noqa: E402
from pnn_fast.train import Trainer, TrainConfig  # noqa: E402

CONFIGS = {
    "dns": ("dns", {}),
    "pnn-paper": ("pnn", {}),
    "pnn-s8-b0": ("pnn", {"in_batch": False, "beta": 0.0}),
    "pnn-ib-hs8-b0": ("pnn", {"hard_negative": "sampled", "beta": 0.0}),
    "pnn-s8-b0-lt16": ("pnn", {"in_batch": False, "beta": 0.0, "lambda_temperature": 16.0}),
    "pnn-dns-anchored": ("pnn", {"preset": "dns-anchored"}),
}


def class_placement(trainer: Trainer, held_out: KnownPositives, users, pos, candidates) -> dict:
    """Counts, over a batch, of unlabeled candidates and of false negatives (held-out positives
    among them) in the negative class, the neutral class and as the hard negative."""
    user_table, item_table = trainer.model.embeddings()
    user_emb = gather_rows(user_table, users)
    known = trainer.known
    scores = reference.row_scores(user_emb, item_table, candidates)
    unlabeled = reference.unlabeled_mask(known, users, pos, candidates)
    k = negative_class_size(unlabeled.sum(1), known.count(users), known.num_items,
                            trainer.objective.args.get("neg_size", "proportional"))
    negative = reference.bottom_k_mask(scores, unlabeled, k)
    hard = reference.hard_negative(scores, unlabeled)
    cand = candidates.expand(users.numel(), -1) if candidates.dim() == 1 else candidates
    false_negative = unlabeled & held_out.contains(users[:, None], cand)
    is_hard = torch.zeros_like(unlabeled)
    is_hard[torch.arange(users.numel())[hard >= 0], hard[hard >= 0]] = True
    out = {}
    for name, mask in (("negative", negative), ("neutral", unlabeled & ~negative), ("hard", is_hard)):
        out[f"unlabeled_{name}"] = int(mask.sum())
        out[f"false_negative_{name}"] = int((mask & false_negative).sum())
    out["unlabeled"], out["false_negative"] = int(unlabeled.sum()), int(false_negative.sum())
    return out


def gradient_shares(trainer: Trainer, users, pos, neg) -> dict:
    """Norm of the item-table gradient of each weighted PNN term alone (PNN objectives only)."""
    loss_fn = trainer.objective.loss_fn
    user_table, item_table = trainer.model.embeddings()
    user_emb = gather_rows(user_table, users)
    _, parts = loss_fn(user_emb, item_table, users, pos, neg, return_components=True)
    lam, valid = parts["lambda"], parts["valid"].to(item_table.dtype)
    rows = valid.sum().clamp_min(1)
    terms = {"bpr": ((1 - lam) * parts["bpr"] * valid).sum() / rows,
             "rank": (lam * parts["rank"] * valid).sum() / rows,
             "constrain": (lam * loss_fn.alpha * parts["constrain"] * valid).sum() / rows,
             "uniform": (lam * valid).sum() / rows * loss_fn.beta * parts["uniform"]}
    norms = {}
    for name, term in terms.items():
        grad = torch.autograd.grad(term, item_table, retain_graph=True, allow_unused=True)[0]
        norms[name] = 0.0 if grad is None else float(grad.norm())
    return norms


def diagnose(data, held_out_pairs, name: str, loss: str, args: dict, epochs: int, batches: int, out: Path) -> list:
    torch.manual_seed(0)
    trainer = Trainer(data, TrainConfig(loss=loss, loss_args=args, epochs=epochs, seed=2020), out / "runs" / name)
    held_out = KnownPositives.from_pairs(*held_out_pairs, data.num_users, data.num_items)
    probe = torch.Generator().manual_seed(7)
    order = torch.randperm(trainer.train_users.numel(), generator=probe)[:batches * 2048]
    history = []
    for epoch in range(1, epochs + 1):
        trainer.train_epoch(progress=False)
        record = {"epoch": epoch, "valid_ndcg@20": trainer.evaluate_split("valid")["ndcg@20"]}
        placement, grads, lambdas = {}, {}, []
        for chunk in order.split(2048):
            users, pos = trainer.train_users[chunk], trainer.train_items[chunk]
            # the loss's own setting (a preset sets it without an in_batch argument)
            in_batch = loss == "pnn" and trainer.objective.loss_fn.num_candidates is None
            candidates = pos if in_batch else sample_unknown(trainer.known, users, 8, probe)
            with torch.no_grad():
                for key, value in class_placement(trainer, held_out, users, pos, candidates).items():
                    placement[key] = placement.get(key, 0) + value
            if loss == "pnn":
                neg = None if in_batch else candidates
                for key, value in gradient_shares(trainer, users, pos, neg).items():
                    grads[key] = grads.get(key, 0.0) + value / batches
                if trainer.objective.loss_fn.attention is not None:
                    with torch.no_grad():
                        user_table, item_table = trainer.model.embeddings()
                        lambdas += trainer.objective.loss_fn.attention(
                            gather_rows(user_table, users), item_table, users, trainer.known).tolist()
        record["placement"] = placement
        record["gradient_norms"] = grads
        if lambdas:
            record["lambda_histogram"] = torch.histc(torch.tensor(lambdas), bins=20, min=0, max=1).tolist()
        history.append(record)
        print(name, json.dumps({k: v for k, v in record.items() if k != "lambda_histogram"}), flush=True)
    return history


def plot(results: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    def enrichment(h, cls):
        """The false-negative rate of a class over the rate among all unlabeled candidates (1: blind)."""
        p = h["placement"]
        overall = p["false_negative"] / max(p["unlabeled"], 1)
        return p[f"false_negative_{cls}"] / max(p[f"unlabeled_{cls}"], 1) / max(overall, 1e-12)

    for name, history in results.items():
        if name == "dns":
            continue
        for cls, style in (("negative", "-"), ("neutral", "--")):
            axes[0].plot([h["epoch"] for h in history], [enrichment(h, cls) for h in history], style,
                         label=f"{name}: {cls}")
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set(title="held-out positives per class: rate / blind rate", xlabel="epoch")
    axes[0].legend(fontsize=7)
    for name, history in results.items():
        axes[1].plot([h["epoch"] for h in history], [enrichment(h, "hard") for h in history], label=name)
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].set(title="hard negative is a held-out positive: rate / blind rate", xlabel="epoch")
    axes[1].legend(fontsize=7)
    for name, history in results.items():
        if history[0]["gradient_norms"]:
            for term in ("bpr", "rank", "constrain", "uniform"):
                total = [sum(h["gradient_norms"].values()) or 1.0 for h in history]
                axes[2].plot([h["epoch"] for h in history], [h["gradient_norms"][term] / t for h, t in zip(history, total)],
                             label=f"{name}: {term}")
    axes[2].set(title="share of the item-table gradient norm", xlabel="epoch")
    axes[2].legend(fontsize=6, loc="center right")
    fig.tight_layout()
    fig.savefig(out / "placement_and_gradients.png", dpi=100)
    plt.close(fig)

    with_lambda = {n: h for n, h in results.items() if "lambda_histogram" in h[0]}
    if with_lambda:
        fig, axes = plt.subplots(1, len(with_lambda), figsize=(5 * len(with_lambda), 3.5), squeeze=False)
        for ax, (name, history) in zip(axes[0], with_lambda.items()):
            image = torch.tensor([h["lambda_histogram"] for h in history]).T
            ax.imshow(image / image.sum(0, keepdim=True).clamp_min(1), aspect="auto", origin="lower",
                      extent=(0.5, len(history) + 0.5, 0, 1), cmap="viridis")
            ax.set(title=f"{name}: lambda per row (share per epoch)", xlabel="epoch", ylabel="lambda")
        fig.tight_layout()
        fig.savefig(out / "lambda.png", dpi=100)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/ml-100k")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batches", type=int, default=4, help="training batches of 2048 probed per epoch")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", default="docs/why-pnn")
    parser.add_argument("--hide-train-share", type=float, default=0.0,
                        help="hide this share of each user's training pairs; they become the false negatives measured")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_dataset(args.data, split="rs", hide_train_share=args.hide_train_share)
    held_out_pairs = data.hidden if args.hide_train_share > 0 else data.valid
    # configurations run before into the same folder are kept, so one can be added at a time
    saved = out / "diagnostics.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    for name in args.configs.split(","):
        loss, loss_args = CONFIGS[name]
        results[name] = diagnose(data, held_out_pairs, name, loss, loss_args, args.epochs, args.batches, out)
        (out / "diagnostics.json").write_text(json.dumps(results, indent=1))
    plot(results, out)


if __name__ == "__main__":
    main()
