"""SRNS (Ding et al., "Simplify and Robustify Negative Sampling for Implicit Collaborative
Filtering", NeurIPS 2020) as a training objective; see docs/baselines/srns.md.

Each user ``u`` keeps a memory ``M_u`` of ``S1`` candidate negatives. For a training pair
``(u, i)``:

* selection: ``j = argmax_{k in M_u} P(k) + alpha_e * std_T[P(k)]`` with
  ``P(k) = sigmoid(r_uk - r_ui)``, the standard deviation taken over the values of ``P(k)``
  at the ends of the last ``T`` epochs, and ``alpha_e = alpha * min(1, e / warmup)`` for the
  0-based epoch ``e`` (the authors' warm-up); BPR against ``j``;
* memory refresh: ``S2 = S1 * S2_div_S1`` fresh uniform unknown items join ``M_u`` and
  ``S1`` of the ``S1 + S2`` are kept, drawn without replacement with probabilities
  ``softmax(r_uk / temperature)``.

Everything is batched tensor work on the memory's device. The score history is kept as
snapshots of the user and item tables taken at each epoch start (the previous epoch's end):
``r_uk`` at a past epoch is ``snapshot_user[u] . snapshot_item[k]``, so the history of any
item, including one that has just entered the memory, is available without scoring every
candidate at every epoch end as the official code does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..sampling import sample_unknown
from .base import BatchLoss, Objective, register


def select_negative(pos_score: torch.Tensor, mem_score: torch.Tensor, hist_pos: torch.Tensor,
                    hist_mem: torch.Tensor, weight: float, variance_only: bool = False) -> torch.Tensor:
    """Index into the memory of each row's SRNS negative.

    Args:
        pos_score: [B] current ``r_ui``; mem_score: [B, S1] current ``r_uk`` of the memory.
        hist_pos: [T, B], hist_mem: [T, B, S1] the same scores at the ends of the last T epochs
            (T may be 0: no history, std 0).
        weight: ``alpha_e``, the weight of the standard deviation.
        variance_only: rank by the standard deviation alone (the official code's ``alpha < 0``).
    Returns:
        int64 [B], the argmax of ``sigmoid(r_uk - r_ui) + weight * std_T[sigmoid(r_uk - r_ui)]``.
    """
    likelihood = torch.sigmoid(mem_score - pos_score[:, None])
    if hist_mem.shape[0] > 0:
        history = torch.sigmoid(hist_mem - hist_pos[..., None])
        std = history.std(dim=0, correction=0)  # population std, as np.sqrt(mean of squares)
    else:
        std = torch.zeros_like(likelihood)
    if variance_only:
        return std.argmax(dim=1)
    return (likelihood + weight * std).argmax(dim=1)


def gumbel_top_k(logits: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``k`` column indices per row drawn without replacement with probabilities ``softmax(logits)``.

    Gumbel top-k: the order of ``logits + Gumbel noise`` is a draw of the sequential
    "pick one proportionally, remove it, renormalise" process (numpy's
    ``choice(p=softmax, replace=False)``, the official code's sampler).

    Args:
        logits: float [R, C]; k <= C.
    Returns:
        int64 [R, k].
    """
    uniform = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    tiny = torch.finfo(logits.dtype).tiny
    gumbel = -torch.log(-torch.log(uniform.clamp_min(tiny)))
    return torch.topk(logits + gumbel, k, dim=1).indices


def first_occurrence(users: torch.Tensor, num_users: int) -> torch.Tensor:
    """int64 [num_users]: the first row of ``users`` [B] holding each user, B when absent.

    The official code refreshes a user's memory once per batch, at the user's first row.
    """
    rows = torch.arange(users.numel(), device=users.device)
    first = torch.full((num_users,), users.numel(), dtype=torch.int64, device=users.device)
    return first.scatter_reduce_(0, users, rows, reduce="amin", include_self=True)


@register("srns")
class SRNSObjective(Objective):
    """BPR with SRNS's variance-aware negatives from a per-user memory refreshed by softmax sampling.

    Buffers (kept in checkpoints): ``memory`` int64 [U, S1]; ``user_history`` [T, U, dim] and
    ``item_history`` [T, I, dim], the tables at the ends of the last ``history_filled`` epochs
    (oldest first, valid rows last); ``epochs_started``.
    """

    DEFAULTS = {
        "S1": 8,               # memory size: SRNS_real/run.sh --S1 8
        "S2_div_S1": 8,        # fresh items per refresh S2 = S1 * 8 = 64: run.sh --S2_div_S1 8
        "alpha": 5.0,          # weight of the std: run.sh --alpha 5.0 (< 0: std alone, SRNS_main.py)
        "warmup": 50,          # epochs over which alpha ramps up: run.sh --warmup 50
        "temperature": 10.0,   # softmax temperature of the refresh: run.sh --temperature 10.0
        "history_epochs": 5,   # epochs of score history for the std: hard-coded 5 in SRNS_main.py
        "reset_memory_each_epoch": True,  # SRNS_main.py swaps in a fresh candidate pool every epoch
    }

    def __init__(self, known, model, **args):
        super().__init__(known, model, **args)
        a = self.args
        for name in ("S1", "S2_div_S1", "history_epochs"):
            value = a[name]
            low = 0 if name == "S2_div_S1" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"srns: {name} must be an int >= {low}, got {value!r}")
        for name in ("alpha", "warmup", "temperature"):
            if not isinstance(a[name], (int, float)) or isinstance(a[name], bool):
                raise ValueError(f"srns: {name} must be a number, got {a[name]!r}")
        if a["warmup"] < 0 or not a["temperature"] > 0:
            raise ValueError(f"srns: warmup must be >= 0 and temperature > 0, "
                             f"got {a['warmup']!r}, {a['temperature']!r}")
        if not isinstance(a["reset_memory_each_epoch"], bool):
            raise ValueError("srns: reset_memory_each_epoch must be true or false, "
                             f"got {a['reset_memory_each_epoch']!r}")
        if a["S1"] > known.num_items:
            raise ValueError(f"srns: S1={a['S1']} exceeds the number of items {known.num_items}")
        self.s1 = a["S1"]
        self.s2 = a["S1"] * a["S2_div_S1"]
        self.num_users, self.num_items = known.num_users, known.num_items
        dtype = model.user_embedding.weight.dtype
        t, dim = a["history_epochs"], model.dim
        self.register_buffer("memory", torch.zeros(self.num_users, self.s1, dtype=torch.int64))
        self.register_buffer("memory_ready", torch.zeros((), dtype=torch.bool))
        self.register_buffer("user_history", torch.zeros(t, self.num_users, dim, dtype=dtype))
        self.register_buffer("item_history", torch.zeros(t, self.num_items, dim, dtype=dtype))
        self.register_buffer("history_filled", torch.zeros((), dtype=torch.int64))
        self.register_buffer("epochs_started", torch.zeros((), dtype=torch.int64))
        # host mirrors of the scalar buffers, so a batch needs no device-to-host copy
        self._epoch, self._filled, self._ready = 0, 0, False
        self.register_load_state_dict_post_hook(lambda module, _: module._read_scalars())

    def _read_scalars(self) -> None:
        self._epoch = max(int(self.epochs_started) - 1, 0)
        self._filled = int(self.history_filled)
        self._ready = bool(self.memory_ready)

    def alpha_weight(self, epoch: int) -> float:
        """``alpha * min(1, epoch / warmup)`` (epoch 0-based; full alpha at once when warmup = 0)."""
        alpha, warmup = float(self.args["alpha"]), float(self.args["warmup"])
        return alpha if warmup == 0 else alpha * min(1.0, epoch / warmup)

    def _init_memory(self, generator) -> None:
        users = torch.arange(self.num_users, device=self.memory.device)
        self.memory.copy_(sample_unknown(self.known, users, self.s1, generator))
        self.memory_ready.fill_(True)
        self._ready = True

    @torch.no_grad()
    def on_epoch_start(self, model, generator, epoch):
        """Snapshot the tables (the previous epoch's end) into the history; redraw the memory.

        As the official code, the scores before training form the history of epoch 0 only:
        from epoch 1 on the history holds the ends of the last ``history_epochs`` epochs.
        """
        epoch = int(self.epochs_started)
        was_training = model.training
        model.eval()  # the scores a user of the model would see (no dropout)
        user_table, item_table = model.embeddings()
        model.train(was_training)
        filled = 0 if epoch == 1 else int(self.history_filled)
        for history, table in ((self.user_history, user_table), (self.item_history, item_table)):
            history.copy_(torch.cat([history[1:], table.detach()[None].to(history.dtype)]))
        self.history_filled.fill_(min(filled + 1, self.user_history.shape[0]))
        self.epochs_started.fill_(epoch + 1)
        self._read_scalars()
        if self.args["reset_memory_each_epoch"] or not self._ready:
            self._init_memory(generator)

    def forward(self, model, users, pos_items, generator, reg_weight=0.0):
        if not self._ready:
            self._init_memory(generator)
        users, pos_items = users.long(), pos_items.long()
        user_table, item_table = model.embeddings()
        user_rows = user_table[users]
        memory = self.memory[users]  # [B, S1]
        with torch.no_grad():
            u = user_rows.detach()
            pos_score = (u * item_table[pos_items].detach()).sum(-1)
            mem_score = torch.einsum("bd,bkd->bk", u, item_table.detach()[memory])
            t = self._filled
            hist_users = self.user_history[-t:][:, users] if t else self.user_history[:0, users]
            hist_items = self.item_history[-t:] if t else self.item_history[:0]
            hist_pos = (hist_users * hist_items[:, pos_items]).sum(-1)
            hist_mem = torch.einsum("tbd,tbkd->tbk", hist_users, hist_items[:, memory])
            pick = select_negative(pos_score, mem_score, hist_pos, hist_mem, self.alpha_weight(self._epoch),
                                   variance_only=float(self.args["alpha"]) < 0)
            neg_items = memory.gather(1, pick[:, None]).squeeze(1)
            self._refresh(u, item_table.detach(), users, memory, generator)
        pos = (user_rows * item_table[pos_items]).sum(-1)
        neg = (user_rows * item_table[neg_items]).sum(-1)
        loss = F.softplus(neg - pos).mean()
        return BatchLoss(loss, users, pos_items, neg_items)

    def _refresh(self, user_rows, item_table, users, memory, generator) -> None:
        """Each batch user's memory becomes S1 draws (no replacement) from memory + S2 fresh items,
        with probabilities softmax(score / temperature); a repeated user is refreshed once."""
        fresh = sample_unknown(self.known, users, self.s2, generator) if self.s2 else memory[:, :0]
        candidates = torch.cat([memory, fresh], dim=1)  # [B, S1 + S2]
        logits = torch.einsum("bd,bcd->bc", user_rows, item_table[candidates]) / float(self.args["temperature"])
        kept = candidates.gather(1, gumbel_top_k(logits, self.s1, generator))
        first = first_occurrence(users, self.num_users)  # [U], B where the user is not in the batch
        padded = torch.cat([kept, kept.new_zeros(1, self.s1)])
        self.memory.copy_(torch.where((first < users.numel())[:, None], padded[first], self.memory))
