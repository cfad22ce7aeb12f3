"""RecBole 1.2.1 models whose ``calculate_loss`` is :class:`pnn_fast.PNNLoss` or :class:`pnn_fast.DNSLoss`.

A RecBole user changes the model::

    from pnn_fast.integrations.recbole import PNNMF, run_recbole
    run_recbole(model=PNNMF, dataset="ml-100k", config_dict={"epochs": 20, "learning_rate": 1e-2})

``PNNMF`` / ``DNSMF`` are RecBole's ``BPR`` model (user and item embeddings, inner-product scores,
its initialisation, ``predict`` and ``full_sort_predict``) and ``PNNLightGCN`` / ``DNSLightGCN``
RecBole's ``LightGCN`` (its graph, propagation, L2 term and evaluation cache), each with only
``calculate_loss`` replaced. They train on (user, positive item) pairs (``InputType.POINTWISE``
with RecBole's training negative sampling off): PNN takes its candidates in-batch, DNS draws
``dns_candidates`` uniform unknown items per row from pnn_fast's sampler. Config keys, defaults
and what differs from RecBole's BPR: docs/recbole.md.

RecBole 1.2.1's own ``recbole.quick_start.run_recbole`` accepts only model names (it passes
``config["model"]``, a string, to ``recbole.utils.get_model``, which searches RecBole's package)
and imports ray; :func:`run_recbole` here runs the same steps with a model class.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from logging import getLogger

try:
    import torch.distributed as dist
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.data.transform import construct_transform
    from recbole.model.general_recommender import BPR, LightGCN
    from recbole.utils import (InputType, get_environment, get_flops, get_model, get_trainer, init_logger,
                               init_seed, set_color)
except ModuleNotFoundError as exc:  # RecBole itself missing: one line; anything else missing inside it: as is
    if (exc.name or "").partition(".")[0] != "recbole":
        raise
    raise ImportError("pnn_fast.integrations.recbole needs RecBole: pip install recbole==1.2.1") from None

import torch

from ..backends.rows import gather_rows
from ..known import KnownPositives
from ..losses import DNSLoss, PNNLoss, loss_defaults
from ..objectives.dns import DNSObjective
from ..sampling import sample_unknown

__all__ = ["DNSLightGCN", "DNSMF", "PNNLightGCN", "PNNMF", "known_positives", "run_recbole"]

# Config keys the models read, with their defaults. RecBole loads a model's defaults only from
# properties/model/<name>.yaml inside its own package, so the models fill in missing keys here.
#: config key -> PNNLoss's argument: the keys' defaults are the loss's own (loss_defaults)
PNN_KEYS = {"pnn_alpha": "alpha", "pnn_beta": "beta", "pnn_noise_max": "noise_max", "pnn_neg_size": "neg_size",
            "pnn_history_len": "history_len", "pnn_lambda_mode": "lambda_mode", "pnn_fixed_lambda": "fixed_lambda",
            "pnn_use_rank": "use_rank", "pnn_candidates": "num_candidates",
            "pnn_hard_candidates": "num_hard_candidates", "loss_backend": "backend"}
PNN_DEFAULTS = {key: loss_defaults(PNNLoss)[argument] for key, argument in PNN_KEYS.items()}
#: the trainer's DNS draws as many candidates (its objective's default), on the loss's default backend
DNS_DEFAULTS = {"dns_candidates": DNSObjective.DEFAULTS["candidates"], "loss_backend": loss_defaults(DNSLoss)["backend"]}
MF_DEFAULTS = {"embedding_size": 64}  # RecBole's BPR.yaml
LIGHTGCN_DEFAULTS = {"embedding_size": 64, "n_layers": 2, "reg_weight": 1e-05, "require_pow": False}  # LightGCN.yaml


def _fill_defaults(config, *defaults: dict) -> None:
    for table in defaults:
        for key, value in table.items():
            if key not in config:
                config[key] = value


def known_positives(dataset) -> KnownPositives:
    """Each user's training items from a RecBole dataset, as pnn_fast's :class:`KnownPositives`.

    RecBole's id 0 is padding for users and items alike. Users keep RecBole's ids (user 0 simply
    knows no item); items are shifted down by one (RecBole item ``i`` is item ``i - 1`` here), so
    that the padding item is never a candidate, a negative or part of a user's history.
    """
    matrix = dataset.inter_matrix(form="coo")  # [user_num, item_num], padding row and column 0 included
    users = torch.from_numpy(matrix.row.astype("int64"))
    items = torch.from_numpy(matrix.col.astype("int64"))
    return KnownPositives.from_pairs(users, items - 1, dataset.user_num, dataset.item_num - 1)


def _pnn_loss(config, known: KnownPositives, dim: int) -> PNNLoss:
    candidates, hard = config["pnn_candidates"], config["pnn_hard_candidates"]
    return PNNLoss(known, dim, alpha=float(config["pnn_alpha"]), beta=float(config["pnn_beta"]),
                   noise_max=float(config["pnn_noise_max"]), neg_size=config["pnn_neg_size"],
                   history_len=int(config["pnn_history_len"]), lambda_mode=config["pnn_lambda_mode"],
                   fixed_lambda=float(config["pnn_fixed_lambda"]), use_rank=bool(config["pnn_use_rank"]),
                   num_candidates=None if candidates is None else int(candidates),
                   num_hard_candidates=None if hard is None else int(hard),
                   backend=config["loss_backend"], validate=False)  # RecBole makes the ids


class _PairsFromRecBole:
    """What the four models share: the known items, and the (user, positive) pairs of a batch."""

    # (user, positive) rows, no negatives: PNN and DNS pick their candidates themselves
    input_type = InputType.POINTWISE
    draws_own_negatives = True  # read by run_recbole, which then turns RecBole's negative sampling off

    def _init_pairs(self, config, dataset) -> None:
        self.LABEL = config["LABEL_FIELD"]
        self.known = known_positives(dataset)
        if config["train_neg_sample_args"]["distribution"] != "none":
            getLogger().warning(
                f"{type(self).__name__} draws its own negatives: RecBole's training negatives "
                f"(train_neg_sample_args={config['train_neg_sample_args']}) are drawn and left unused; "
                "set train_neg_sample_args: ~ (run_recbole of pnn_fast.integrations.recbole does)")

    def _pairs(self, interaction):
        """``(users, items)`` of the batch's positive rows; items in the loss's ids (RecBole's minus 1)."""
        users, items = interaction[self.USER_ID], interaction[self.ITEM_ID]
        if self.LABEL in interaction:  # RecBole's point-wise negatives (label 0) or a rating threshold
            keep = interaction[self.LABEL] > 0
            users, items = users[keep], items[keep]
        self.known = self.known.to(users.device)  # moved once, then cached
        return users, items - 1


class PNNMF(_PairsFromRecBole, BPR):
    """RecBole's BPR model (MF) trained with :class:`pnn_fast.PNNLoss`; its attention is ``self.pnn_loss``."""

    def __init__(self, config, dataset):
        _fill_defaults(config, MF_DEFAULTS, PNN_DEFAULTS)
        super().__init__(config, dataset)  # BPR: embeddings, xavier_normal init
        self._init_pairs(config, dataset)
        self.pnn_loss = _pnn_loss(config, self.known, self.embedding_size)  # made after BPR's init: keeps its own

    def calculate_loss(self, interaction):
        users, pos = self._pairs(interaction)
        return self.pnn_loss(gather_rows(self.user_embedding.weight, users), self.item_embedding.weight[1:],
                             users, pos)


class _DNSFromRecBole(_PairsFromRecBole):
    """What the two DNS models share: the loss, and its draws."""

    def _init_dns(self, config, dataset) -> None:
        self._init_pairs(config, dataset)
        self.dns_candidates = int(config["dns_candidates"])
        self.dns_loss = DNSLoss(self.known, backend=config["loss_backend"], validate=False)

    def _dns(self, user_rows, item_table, users, pos):
        """BPR of each row against the hardest of ``dns_candidates`` uniform unknown items."""
        neg = sample_unknown(self.known, users, self.dns_candidates, backend=self.dns_loss.backend)
        return self.dns_loss(user_rows, item_table, users, pos, neg)


class DNSMF(_DNSFromRecBole, BPR):
    """RecBole's BPR model (MF) trained with :class:`pnn_fast.DNSLoss`: BPR against the hardest of
    ``dns_candidates`` uniform unknown items of each row."""

    def __init__(self, config, dataset):
        _fill_defaults(config, MF_DEFAULTS, DNS_DEFAULTS)
        super().__init__(config, dataset)
        self._init_dns(config, dataset)

    def calculate_loss(self, interaction):
        users, pos = self._pairs(interaction)
        return self._dns(gather_rows(self.user_embedding.weight, users), self.item_embedding.weight[1:], users, pos)


class _LightGCNLoss(_PairsFromRecBole):
    def _propagated(self, users):
        """Propagated user rows and item table (RecBole's ``LightGCN.forward``), plus its L2 term."""
        if self.restore_user_e is not None or self.restore_item_e is not None:  # as LightGCN: stale after a step
            self.restore_user_e, self.restore_item_e = None, None
        user_all, item_all = self.forward()
        return gather_rows(user_all, users), item_all[1:]

    def _l2(self, users, pos):
        """RecBole LightGCN's ``reg_weight * EmbLoss`` of the batch's ego embeddings (users, positives)."""
        if self.reg_weight == 0:
            return 0.0
        return self.reg_weight * self.reg_loss(self.user_embedding(users), self.item_embedding(pos + 1),
                                               require_pow=self.require_pow)


class PNNLightGCN(_LightGCNLoss, LightGCN):
    """RecBole's LightGCN trained with :class:`pnn_fast.PNNLoss` on its propagated embeddings, plus
    LightGCN's own L2 term (``reg_weight``, 0 turns it off)."""

    def __init__(self, config, dataset):
        _fill_defaults(config, LIGHTGCN_DEFAULTS, PNN_DEFAULTS)
        super().__init__(config, dataset)  # LightGCN: graph, embeddings, xavier_uniform init
        self._init_pairs(config, dataset)
        self.pnn_loss = _pnn_loss(config, self.known, self.latent_dim)

    def calculate_loss(self, interaction):
        users, pos = self._pairs(interaction)
        user_rows, item_table = self._propagated(users)
        return self.pnn_loss(user_rows, item_table, users, pos) + self._l2(users, pos)


class DNSLightGCN(_DNSFromRecBole, _LightGCNLoss, LightGCN):
    """RecBole's LightGCN trained with :class:`pnn_fast.DNSLoss` (hardest of ``dns_candidates``
    uniform unknown items), plus LightGCN's own L2 term (``reg_weight``)."""

    def __init__(self, config, dataset):
        _fill_defaults(config, LIGHTGCN_DEFAULTS, DNS_DEFAULTS)
        super().__init__(config, dataset)
        self._init_dns(config, dataset)

    def calculate_loss(self, interaction):
        users, pos = self._pairs(interaction)
        user_rows, item_table = self._propagated(users)
        return self._dns(user_rows, item_table, users, pos) + self._l2(users, pos)


@contextmanager
def _own_checkpoints_load():
    """RecBole 1.2.1 reloads the checkpoint it has just written (a pickle holding its Config) with a bare
    ``torch.load``, which torch >= 2.6 refuses by default (weights_only); allow it for this run only."""
    key = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    if before is None:
        os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


def run_recbole(model=None, dataset=None, config_file_list=None, config_dict=None, saved=True):
    """RecBole 1.2.1's ``recbole.quick_start.run_recbole``, step for step, for a model class or name.

    The same configuration, seeding, logging, dataset, split, FLOPs count, trainer (``get_trainer``),
    ``fit`` and test evaluation, and the same result dict: ``best_valid_score``, ``valid_score_bigger``,
    ``best_valid_result``, ``test_result``. Two differences: ``model`` may be a class (RecBole's version
    looks every name up in its own package), and for the models of this module, which draw their own
    negatives, ``train_neg_sample_args`` defaults to ``None`` (no RecBole training negatives) unless
    ``config_dict`` sets it. Single process only (RecBole's ``run`` spreads over several).
    """
    model_class = get_model(model) if isinstance(model, str) else model
    config_dict = dict(config_dict or {})
    if getattr(model_class, "draws_own_negatives", False):
        config_dict.setdefault("train_neg_sample_args", None)
    config = Config(model=model_class, dataset=dataset, config_file_list=config_file_list, config_dict=config_dict)
    init_seed(config["seed"], config["reproducibility"])
    init_logger(config)
    logger = getLogger()
    logger.info(sys.argv)
    logger.info(config)

    dataset = create_dataset(config)
    logger.info(dataset)
    train_data, valid_data, test_data = data_preparation(config, dataset)

    init_seed(config["seed"] + config["local_rank"], config["reproducibility"])
    model = model_class(config, train_data._dataset).to(config["device"])
    logger.info(model)
    transform = construct_transform(config)
    flops = get_flops(model, dataset, config["device"], logger, transform)
    logger.info(set_color("FLOPs", "blue") + f": {flops}")

    trainer = get_trainer(config["MODEL_TYPE"], config["model"])(config, model)
    with _own_checkpoints_load():
        best_valid_score, best_valid_result = trainer.fit(train_data, valid_data, saved=saved,
                                                          show_progress=config["show_progress"])
        test_result = trainer.evaluate(test_data, load_best_model=saved, show_progress=config["show_progress"])

    environment_tb = get_environment(config)
    logger.info("The running environment of this training is as follows:\n" + environment_tb.draw())
    logger.info(set_color("best valid ", "yellow") + f": {best_valid_result}")
    logger.info(set_color("test result", "yellow") + f": {test_result}")
    if not config["single_spec"]:
        dist.destroy_process_group()
    return {"best_valid_score": best_valid_score, "valid_score_bigger": config["valid_metric_bigger"],
            "best_valid_result": best_valid_result, "test_result": test_result}
