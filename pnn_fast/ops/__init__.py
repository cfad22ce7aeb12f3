"""Typed wrappers over the compiled kernels ``torch.ops.pnn_fast.*``: one module per op, each with
the op's wrapper, its fake (meta) implementation and, where it is differentiable, its autograd.

Shapes: ``B`` rows, ``C`` candidates, ``d`` embedding size, ``I`` items.  Candidates are int
``[C]`` shared by every row (in-batch mode) or ``[B, C]`` per row (sampled mode); ids may be
int32 or int64.  Embeddings are float16, bfloat16, float32 or float64 (the kernels accumulate
float16/bfloat16 in float32).  Non-contiguous inputs are accepted.

Per row ``b`` with user ``u`` and positive ``i``, ``U_b`` is the set of candidate indices ``j``
whose item is neither ``i`` nor a known positive of ``u``; ``s_j`` is ``<user_emb[b], item_table[c_j]>``.
No op allocates anything of size ``[B, C]``.

The table-lookup ops of a training step (:func:`unknown_items`, :func:`history_sample`,
:func:`embedding_bpr`, :func:`gathered_norm`, :func:`gathered_dots`, :func:`unit_rows`) take whole embedding tables
and ids, and return dense table gradients.  :func:`csr_spmm` is the graph models'
propagation, a CSR matrix times a table.  :func:`masked_logsumexp` reduces a [B, M] matrix of
logits (a sampled softmax's denominators) to [B].

Importing this package needs the compiled extension (ImportError otherwise).
"""
from .class_centroids import class_centroids
from .class_terms import class_terms
from .count_unlabeled import count_unlabeled
from .csr_spmm import csr_spmm
from .dot_topk import dot_topk
from .embedding_bpr import embedding_bpr
from .gathered_dots import gathered_dots
from .gathered_norm import gathered_norm
from .hard_negative_argmax import hard_negative_argmax
from .history_sample import history_sample
from . import ids_in_range, take_input_error  # noqa: F401  (their fake kernels; pnn_fast._checks calls them)
from .lowest_k_mask import lowest_k_mask
from .masked_logsumexp import masked_logsumexp
from .masked_topk import masked_topk
from .pairwise_uniformity import pairwise_uniformity
from .rows_contain import rows_contain
from .unit_rows import unit_rows
from .unknown_items import unknown_items

__all__ = ["class_centroids", "class_terms", "count_unlabeled", "csr_spmm", "dot_topk", "embedding_bpr", "gathered_dots", "gathered_norm",
           "hard_negative_argmax", "history_sample", "lowest_k_mask", "masked_logsumexp", "masked_topk", "pairwise_uniformity",
           "rows_contain", "unit_rows", "unknown_items"]
