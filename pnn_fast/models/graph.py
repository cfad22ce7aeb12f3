"""The user-item graph as a sparse, symmetric-normalised adjacency matrix.

The graph recommenders (LightGCN, NGCF, SGL) propagate embeddings over the
bipartite interaction graph with ``N = num_users + num_items`` nodes: user
``u`` is node ``u`` and item ``i`` is node ``num_users + i``.  As in RecBole
v1.1.1 (``get_norm_adj_mat`` of LightGCN/NGCF, ``create_adjust_matrix`` of
SGL) the matrix is

    A_hat = D^-1/2 A D^-1/2,    A = [[0, R], [R^T, 0]],    D = diag(rowsum(A) + 1e-7)

with ``R`` the binary ``[U, I]`` interaction matrix (repeated pairs count once)
and the ``1e-7`` keeping isolated nodes finite.  Only the ``2 * nnz(R)``
non-zeros are ever stored (CSR); no dense ``N x N`` or ``U x I`` matrix exists.

The CSR pieces live in plain dense buffers of a small module so that
``model.to(device)``, ``copy.deepcopy`` and ``state_dict`` work (torch cannot
deep-copy a sparse CSR tensor); the CSR view is rebuilt per call, which copies
nothing.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from .. import backends
from ..csr import CSR

# torch warns once per process that CSR support is "beta"; the few CSR ops used here
# (construction, CSR @ dense) are long-standing, so the notice is only noise for users.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)

# RecBole adds this to every degree before the inverse square root.
DEGREE_EPS = 1e-7


def unique_edges(users: torch.Tensor, items: torch.Tensor, num_users: int, num_items: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct (user, item) pairs, sorted by user then item.

    Args:
        users, items: integer tensors of equal shape [n]; ``0 <= users < num_users``, ``0 <= items < num_items``.
    Returns:
        (users, items): int64 [m], m <= n.
    Raises:
        ValueError: shapes differ or an id is out of range.
    """
    users = torch.as_tensor(users).reshape(-1).long()
    items = torch.as_tensor(items).reshape(-1).long()
    if users.shape != items.shape:
        raise ValueError(f"train_users and train_items must have one shape, got {tuple(users.shape)} and {tuple(items.shape)}")
    if users.numel():
        if int(users.min()) < 0 or int(users.max()) >= num_users:
            raise ValueError(f"train_users must lie in [0, {num_users}), got [{int(users.min())}, {int(users.max())}]")
        if int(items.min()) < 0 or int(items.max()) >= num_items:
            raise ValueError(f"train_items must lie in [0, {num_items}), got [{int(items.min())}, {int(items.max())}]")
    keys = torch.unique(users * num_items + items)  # sorted
    return keys // num_items, keys % num_items


def _sparse(csr: CSR) -> torch.Tensor:
    """The torch sparse CSR tensor [n, n] over ``csr``'s buffers (no copy)."""
    return torch.sparse_csr_tensor(csr.indptr, csr.indices, csr.values, (csr.num_rows, csr.num_cols),
                                   check_invariants=False)


def _product(adj: torch.Tensor, x: torch.Tensor, addend: torch.Tensor | None = None, divisor: float = 1.0,
             backend: str = "auto") -> torch.Tensor:
    """``(addend + adj @ x) / divisor`` on ``backend`` ("auto": the ``csr_spmm`` kernel where it was built)."""
    return backends.select(backend, x.device).csr_spmm(adj, x, addend, divisor)


class _SpMM(torch.autograd.Function):
    """``adj @ x`` differentiable in ``x`` only; the backward uses the given transpose.

    torch's own backward of a CSR product transposes the matrix on every call;
    for the (usually symmetric) adjacency the transpose is known up front.
    """

    @staticmethod
    def forward(ctx, adj: torch.Tensor, adj_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.adj_t = adj_t
        return _product(adj, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, _product(ctx.adj_t, grad)


def sparse_matmul(adj: torch.Tensor, x: torch.Tensor, adj_t: torch.Tensor | None = None) -> torch.Tensor:
    """``adj @ x`` for a sparse CSR ``adj`` [N, N] and dense ``x`` [N, d], differentiable in ``x``.

    ``adj_t`` is ``adj``'s transpose (CSR); None means ``adj`` is symmetric.
    """
    return _SpMM.apply(adj, adj if adj_t is None else adj_t, x)


def _horner_mean(adj: torch.Tensor, x: torch.Tensor, n_layers: int, backend: str) -> torch.Tensor:
    """``(x + adj x + ... + adj^n_layers x) / (n_layers + 1)`` by Horner's rule,
    ``(x + adj (x + adj (x + ...))) / (n_layers + 1)``: n_layers products, each adding x as it goes."""
    total = x
    for layer in range(n_layers):
        last = layer == n_layers - 1
        total = _product(adj, total, x, float(n_layers + 1) if last else 1.0, backend)
    return total


class _LayerMean(torch.autograd.Function):
    """:func:`layer_mean` with its backward: the mean of powers of a symmetric matrix is symmetric, so the
    gradient is the same polynomial of the matrix applied to the output's gradient."""

    @staticmethod
    def forward(ctx, adj: torch.Tensor, x: torch.Tensor, n_layers: int, backend: str) -> torch.Tensor:
        ctx.adj, ctx.n_layers, ctx.backend = adj, n_layers, backend
        return _horner_mean(adj, x, n_layers, backend)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, _horner_mean(ctx.adj, grad, ctx.n_layers, ctx.backend), None, None


def layer_mean(adj: torch.Tensor, ego: torch.Tensor, n_layers: int, backend: str = "auto") -> torch.Tensor:
    """LightGCN's mean of layers ``(E_0 + E_1 + ... + E_L) / (L + 1)``, ``E_l = adj @ E_{l-1}``, ``E_0 = ego``.

    Args:
        adj: a symmetric sparse CSR matrix [N, N] (the normalised adjacency); ego: float [N, d];
        n_layers: L >= 0; backend: the products' implementation, as for PNNLoss (``backends.select``).
    Returns:
        [N, d], differentiable in ``ego``: L products forward and L backward, with the layer sums and the
        division inside them (summed one by one, the layers cost three more passes over [N, d] forward,
        and autograd's accumulations of their gradients backward).
        Equal to the layer-by-layer sum to rounding (the additions are grouped differently).
    """
    backends.check_name(backend)
    if n_layers == 0:
        return ego
    return _LayerMean.apply(adj, ego, n_layers, backend)


class NormalizedAdjacency(nn.Module):
    """``D^-1/2 A D^-1/2`` of a user-item graph, stored as CSR buffers (not saved in state_dict).

    Attributes:
        num_users, num_items: id-space sizes; ``n = num_users + num_items`` nodes.
        crow_indices: int64 [n + 1]; col_indices: int64 [2m]; values: float32 [2m]
            for the m distinct training pairs.
    """

    def __init__(self, users: torch.Tensor, items: torch.Tensor, num_users: int, num_items: int):
        """Build from training pairs (int tensors [n], duplicates ignored); all on ``users``' device."""
        super().__init__()
        self.num_users, self.num_items = int(num_users), int(num_items)
        n = self.num_users + self.num_items
        users, items = unique_edges(users, items, num_users, num_items)
        rows = torch.cat([users, items + num_users])
        cols = torch.cat([items + num_users, users])
        degree = torch.bincount(rows, minlength=n).double() + DEGREE_EPS
        inv_sqrt = degree.rsqrt()
        # float64 products then one rounding, as RecBole (scipy computes D*A*D in float64).
        values = (inv_sqrt[rows] * inv_sqrt[cols]).float()
        csr = CSR.from_checked_pairs(rows, cols, n, n, values)
        self.register_buffer("crow_indices", csr.indptr, persistent=False)
        self.register_buffer("col_indices", csr.indices, persistent=False)
        self.register_buffer("values", csr.values, persistent=False)

    @property
    def num_nodes(self) -> int:
        return self.num_users + self.num_items

    def csr(self) -> torch.Tensor:
        """The matrix as a torch sparse CSR tensor [n, n] float32 (a view of the buffers)."""
        n = self.num_nodes
        return _sparse(CSR(self.crow_indices, self.col_indices, n, n, self.values))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``A_hat @ x`` for x [n, d] -> [n, d]; the matrix is symmetric, so its backward reuses it."""
        return sparse_matmul(self.csr(), x)

    def dropout_entries(self, rate: float) -> tuple[torch.Tensor, torch.Tensor]:
        """RecBole NGCF's ``SparseDropout``: drop each stored entry independently with probability
        ``rate`` and scale the kept ones by ``1 / (1 - rate)``.

        The result is not symmetric any more, so both it and its transpose are returned (CSR [n, n]).
        """
        keep = torch.rand(self.values.shape, device=self.values.device) >= rate
        n = self.num_nodes
        rows = torch.repeat_interleave(torch.arange(n, device=self.crow_indices.device), self.crow_indices.diff())
        rows, cols = rows[keep], self.col_indices[keep]
        values = self.values[keep] / (1.0 - rate)
        adj, adj_t = (_sparse(CSR.from_checked_pairs(a, b, n, n, values)) for a, b in ((rows, cols), (cols, rows)))
        return adj, adj_t
