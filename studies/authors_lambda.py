"""The batch lambda of trained pnn-authors cells (PNN as the authors' code computes it), one command:

    python studies/authors_lambda.py ../shared/data/ml-100k studies/screen2-ml100k/cells/ml-100k/mf/pnn-authors/seed*/checkpoint.pt

Their lambda weights the BPR term against DNS's hardest of 8 (``lambda bpr + (1 - lambda) pnn``),
so lambda = 1 leaves DNS alone. For each checkpoint (the cell's last epoch), the trained attention
is evaluated on 20 random batches of 2048 training pairs (seed 0) of the dataset's split, with
each user's first 20 known items as the history, on the tables the model scores with (for LightGCN
the propagated ones, as in training); prints the mean, min and max.
"""
from __future__ import annotations

import argparse

import torch

from pnn_fast.data.loaders import load_dataset
from pnn_fast.known import KnownPositives
from pnn_fast.models import build_model
from pnn_fast.objectives.pnn_authors import AuthorsAttention, first_known


def batch_lambdas(checkpoint: dict, data, known: KnownPositives, batches: int = 20, batch_size: int = 2048,
                  history_len: int = 20, gamma: float = 0.1) -> torch.Tensor:
    """float [batches]: the attention's lambda on random batches of the training pairs' users (``data``'s
    split, whose pairs also build a graph model's adjacency)."""
    config = checkpoint["config"]
    users_all, items_all = data.train
    model = build_model(config["model"], data.num_users, data.num_items, users_all, items_all, dim=config["dim"],
                        **config["model_args"])
    model.load_state_dict(checkpoint["model"])
    model.eval()
    attention = AuthorsAttention(config["dim"], gamma)
    attention.load_state_dict({k.removeprefix("attention."): v for k, v in checkpoint["objective"].items()})
    generator = torch.Generator().manual_seed(0)
    values = []
    with torch.no_grad():
        user_table, item_table = model.embeddings()  # what the objective scores with in training
        for _ in range(batches):
            users = users_all[torch.randint(0, users_all.numel(), (batch_size,), generator=generator)]
            history, valid = first_known(known, users, history_len)
            values.append(float(attention(user_table[users], item_table[history], valid)))
    return torch.tensor(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="the dataset folder the cells trained on (split rs)")
    parser.add_argument("checkpoints", nargs="+", help="pnn-authors cells' checkpoint.pt")
    args = parser.parse_args()
    data = load_dataset(args.data, split="rs")
    known = KnownPositives.from_pairs(*data.train, data.num_users, data.num_items)
    for path in args.checkpoints:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        lam = batch_lambdas(checkpoint, data, known)
        print(f"{path}: epoch {checkpoint['epoch']}, lambda over {lam.numel()} batches: "
              f"mean {lam.mean():.4f}, min {lam.min():.4f}, max {lam.max():.4f}")


if __name__ == "__main__":
    main()
