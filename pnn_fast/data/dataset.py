"""The in-memory dataset every loader returns, and the error for malformed files."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import torch

Pairs = tuple[torch.Tensor, torch.Tensor]


class DataFormatError(ValueError):
    """A data file that cannot be parsed; the message reads ``<file>:<line>: <problem>``.

    Attributes:
        path: the offending file.
        line: 1-based line number of the problem.
        problem: what was wrong, in words.
    """

    def __init__(self, path: os.PathLike | str, line: int, problem: str):
        super().__init__(f"{path}:{line}: {problem}")
        self.path = str(path)
        self.line = int(line)
        self.problem = problem

    def __reduce__(self):
        # Exceptions pickle through ``args`` (the formatted message), which does
        # not match this constructor; rebuild from the parts instead.
        return (type(self), (self.path, self.line, self.problem))


@dataclass
class Dataset:
    """Implicit-feedback interactions split into train / valid / test.

    Ids are 0-based and contiguous: ``0 <= user < num_users`` and
    ``0 <= item < num_items``.  Each split is a pair ``(users, items)`` of int64
    tensors of shape [n_split] on the CPU, sorted by user then item, with no
    duplicate pair inside a split and no pair shared between splits.

    Attributes:
        name: folder or file stem the data came from (``"synthetic"`` for generated data).
        num_users, num_items: sizes of the id spaces.
        train, valid, test: the splits; ``valid`` may be empty (zero-length tensors).
        user_ids: original id of each internal user id (``user_ids[u]``), ``int`` where
            every original id was a canonical integer, else ``str``; ``None`` for synthetic data.
        item_ids: the same for items.
        duplicates: copies of (user, item) pairs that the files list more than once (after the
            rating threshold), dropped by the loader; 0 for synthetic data.
        hidden: training pairs the loader hid (``hide_train_share``), sorted as the splits, or
            ``None``: in no split, so unlabeled to the model.
    """

    name: str
    num_users: int
    num_items: int
    train: Pairs
    valid: Pairs
    test: Pairs
    user_ids: list | None = None
    item_ids: list | None = None
    duplicates: int = 0
    hidden: Pairs | None = None

    def summary(self) -> str:
        """One line: users, items, interactions per split and density, and the duplicate pairs
        dropped and training pairs hidden when there were any (a silently shrunken data set would
        go unnoticed)."""
        sizes = [int(split[0].numel()) for split in (self.train, self.valid, self.test)]
        total = sum(sizes)
        density = total / max(self.num_users * self.num_items, 1)
        dropped = f"; {self.duplicates:,} duplicate (user, item) pairs dropped" if self.duplicates else ""
        if self.hidden is not None:
            dropped += f"; {int(self.hidden[0].numel()):,} training pairs hidden (unlabeled)"
        return (
            f"{self.name}: {self.num_users:,} users, {self.num_items:,} items, "
            f"{total:,} interactions (train {sizes[0]:,} / valid {sizes[1]:,} / test {sizes[2]:,}), "
            f"density {density:.4%}{dropped}"
        )

    def fingerprint(self) -> dict:
        """``{"data": ..., "split": ...}``, two hex digests: of the interactions as ids (the id maps
        and every pair, whichever split holds it), and of the split (which pairs train, validate and
        test). Not of the files' bytes: the same data read from another copy or format matches.
        A checkpoint stores it, so that resuming, evaluating or recommending on other data, or on
        another split of the same data, is refused instead of scored."""
        def digest(*parts) -> str:
            hasher = hashlib.sha256()
            for part in parts:
                hasher.update(part.contiguous().numpy().tobytes() if isinstance(part, torch.Tensor)
                              else json.dumps(part, default=str).encode())
            return hasher.hexdigest()[:16]

        splits = (self.train, self.valid, self.test)
        users = torch.cat([s[0].long().cpu() for s in splits])
        items = torch.cat([s[1].long().cpu() for s in splits])
        order = torch.argsort(users * self.num_items + items)  # the pairs, whatever split holds them
        data = digest([self.num_users, self.num_items, self.user_ids, self.item_ids], users[order], items[order])
        return {"data": data, "split": digest(*(t.long().cpu() for pair in splits for t in pair))}
