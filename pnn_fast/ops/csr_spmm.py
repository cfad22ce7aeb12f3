"""pnn_fast::csr_spmm: ``(addend + A @ x) / divisor`` for a CSR matrix ``A``, the graph
models' propagation (LightGCN's mean of layers is two such products, :func:`pnn_fast.models.graph.layer_mean`).
Not differentiable itself: :mod:`pnn_fast.models.graph` gives the backward as products of the transpose,
which for the symmetric adjacency is this op again."""
from __future__ import annotations

import torch

from .. import _extension
from ._common import OPS


def csr_spmm(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, x: torch.Tensor,
             addend: torch.Tensor | None = None, divisor: float = 1.0) -> torch.Tensor:
    """``(addend + A @ x) / divisor`` for the CSR matrix ``A`` = (indptr, indices, values) [n, m].

    Args:
        indptr: int64 [n + 1], rising from 0 to nnz; indices: int64 [nnz], each in [0, m);
        values: [nnz] in x's dtype; x: float [m, d]; addend: [n, d] in x's dtype, or None for zeros;
        divisor: a finite non-zero float.
    Returns:
        [n, d] in x's dtype. Row r of ``A @ x`` is ``sum_e values[e] * x[indices[e]]`` over the row's entries
        in stored order (on the CPU multiply then add, on CUDA fused multiply-adds; in float32 for
        float16/bfloat16 inputs), then the addend is added and the sum divided: torch's
        ``(addend + A @ x) / divisor`` to rounding, whatever the thread count.
    """
    _extension.require_kernels(x.device)
    return OPS.csr_spmm.default(indptr, indices, values, x, addend, divisor)


@torch.library.register_fake("pnn_fast::csr_spmm")
def _(indptr, indices, values, x, addend=None, divisor=1.0):
    return x.new_empty((indptr.shape[0] - 1, x.shape[1]))
