"""What a trained model gives to serve: each user's top K items, and the embeddings with their ids.

:func:`top_items` streams users through the evaluator's ranking (:func:`pnn_fast.eval.ranked_items`,
in blocks or chunks of items), so a catalog of millions of items never builds a
[users, items] matrix; :func:`write_recommendations` writes them as CSV in the data's original ids;
:func:`export_embeddings` writes the two tables as ``.npy`` files with an id map each, for a vector
index (FAISS, a database) to serve.
"""
from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from . import backends
from .csr import CSR
from .eval import ranked_items


@torch.no_grad()
def top_items(user_table: torch.Tensor, item_table: torch.Tensor, users: torch.Tensor, exclude: Sequence[CSR],
              k: int, batch_size: int = 1024, backend: str = "auto") -> Iterator[tuple]:
    """Each user's ``k`` best items by dot product, excluded items left out, ``batch_size`` users at a time.

    Args:
        user_table: float [U, d]; item_table: float [I, d]; users: int [n], rows of ``user_table``;
        exclude: CSRs over users of items never recommended to their user (the known ones);
        k: 1 <= k <= I; batch_size: users ranked at a time (each block of items is streamed once per
        batch, so larger batches run nearer the product's rate); backend: who ranks (as
        :func:`pnn_fast.eval.evaluate`'s).
    Yields:
        ``(users int64 [b], items int64 [b, k], scores [b, k])`` per batch, best first, equal scores
        by ascending item id; a user with fewer than k items left has -1 items and -inf scores in
        the remaining slots.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= item_table.shape[0]:
        raise ValueError(f"k must be an int in [1, {item_table.shape[0]}] (the number of items), got {k!r}")
    ranking = backends.select(backend, user_table.device)
    for begin in range(0, users.numel(), batch_size):
        batch = users[begin:begin + batch_size].long()
        top = ranked_items(ranking, user_table[batch], batch, item_table, exclude, k)
        yield batch, torch.where(top.values > -math.inf, top.indices, torch.full_like(top.indices, -1)), top.values


def write_recommendations(path: os.PathLike | str, batches: Iterator[tuple], user_ids: Sequence | None,
                          item_ids: Sequence | None) -> int:
    """CSV ``user,rank,item,score`` (rank from 1) of :func:`top_items`' batches, in the data's original
    ids (internal ids where the data has none); returns the rows written. Written through a
    temporary file: a run stopped halfway leaves no partial file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    written = 0
    try:
        with open(tmp, "w", newline="") as handle:
            out = csv.writer(handle)
            out.writerow(["user", "rank", "item", "score"])
            for users, items, scores in batches:
                for user, row_items, row_scores in zip(users.tolist(), items.tolist(), scores.tolist()):
                    name = user_ids[user] if user_ids is not None else user
                    for rank, (item, score) in enumerate(zip(row_items, row_scores), start=1):
                        if item < 0:
                            break
                        out.writerow([name, rank, item_ids[item] if item_ids is not None else item, f"{score:.6g}"])
                        written += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return written


def export_embeddings(folder: os.PathLike | str, user_table: torch.Tensor, item_table: torch.Tensor,
                      user_ids: Sequence | None, item_ids: Sequence | None) -> list[Path]:
    """``user_embeddings.npy`` [U, d] and ``item_embeddings.npy`` [I, d] (float32), the tables the
    model ranks with (a user's score of an item is the dot product of their rows), row r being the
    user or item ``*_ids.json[r]`` in the data's original ids (internal ids when it has none), and
    ``embeddings.json`` with the sizes. Returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for side, table, ids in (("user", user_table, user_ids), ("item", item_table, item_ids)):
        array = table.detach().to("cpu", torch.float32).numpy()
        names = list(ids) if ids is not None else list(range(array.shape[0]))
        np.save(folder / f"{side}_embeddings.npy", array)
        (folder / f"{side}_ids.json").write_text(json.dumps(names) + "\n")
        paths += [folder / f"{side}_embeddings.npy", folder / f"{side}_ids.json"]
    info = {"score": "dot product of a user row and an item row", "dim": int(user_table.shape[1]),
            "users": int(user_table.shape[0]), "items": int(item_table.shape[0])}
    (folder / "embeddings.json").write_text(json.dumps(info, indent=1) + "\n")
    return paths + [folder / "embeddings.json"]
