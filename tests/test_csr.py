"""CSR, the package's one compressed-row type: construction, invariants, and its three users."""
import pytest
import torch

from pnn_fast import CSR, KnownPositives
from pnn_fast.models import NormalizedAdjacency


def test_from_pairs_sorts_and_deduplicates():
    csr = CSR.from_pairs(torch.tensor([2, 0, 2, 2, 0]), torch.tensor([5, 3, 1, 5, 3]), 4, 6)
    assert csr.indptr.tolist() == [0, 1, 1, 3, 3]
    assert csr.indices.tolist() == [3, 1, 5]
    assert csr.values is None and (csr.num_rows, csr.num_cols, csr.nnz) == (4, 6, 3)
    assert csr.row_lengths(torch.tensor([0, 1, 2])).tolist() == [1, 0, 2]


def test_from_pairs_with_values_permutes_them_into_row_order():
    rows, cols = torch.tensor([1, 0, 1, 0]), torch.tensor([0, 2, 1, 0])
    values = torch.tensor([10.0, 20.0, 30.0, 40.0])
    csr = CSR.from_pairs(rows, cols, 2, 3, values)
    assert csr.indptr.tolist() == [0, 2, 4]
    assert csr.indices.tolist() == [0, 2, 0, 1]
    assert csr.values.tolist() == [40.0, 20.0, 10.0, 30.0]


@pytest.mark.parametrize("rows, cols, num_rows, num_cols, match", [
    (torch.tensor([2]), torch.tensor([0]), 2, 3, "rows has ids outside"),
    (torch.tensor([0]), torch.tensor([-1]), 2, 3, "cols has ids outside"),
    (torch.tensor([0]), torch.tensor([0, 1]), 2, 3, r"cols must have shape \[1\]"),
    (torch.tensor([0.0]), torch.tensor([0]), 2, 3, "rows must be int32 or int64"),
    (torch.tensor([0]), torch.tensor([0]), 0, 3, "num_rows must be a positive int"),
])
def test_from_pairs_names_the_bad_argument(rows, cols, num_rows, num_cols, match):
    with pytest.raises((ValueError, TypeError), match=match):
        CSR.from_pairs(rows, cols, num_rows, num_cols)


def test_constructor_checks_shapes():
    with pytest.raises(ValueError, match=r"indptr must have shape \[num_rows \+ 1\]"):
        CSR(torch.tensor([0, 1]), torch.tensor([0]), 2, 3)
    with pytest.raises(ValueError, match="values must have the shape"):
        CSR(torch.tensor([0, 1]), torch.tensor([0]), 1, 3, values=torch.ones(2))


def test_known_positives_is_a_csr_with_membership():
    known = KnownPositives.from_pairs(torch.tensor([1, 0, 1]), torch.tensor([4, 2, 0]), 3, 5)
    assert isinstance(known, CSR) and (known.num_users, known.num_items) == (3, 5)
    assert known.indices.tolist() == [2, 0, 4]
    assert known.contains(torch.tensor([0, 1, 1, 2]), torch.tensor([2, 4, 2, 0])).tolist() == [True, True, False, False]
    assert known.count(torch.tensor([0, 1, 2])).tolist() == [1, 2, 0]


def test_graph_adjacency_is_built_on_the_csr_type():
    users, items = torch.tensor([0, 0, 1]), torch.tensor([1, 0, 1])
    adj = NormalizedAdjacency(users, items, 2, 2)
    dense = adj.csr().to_dense()
    assert torch.equal(dense, dense.T) and dense.shape == (4, 4)
    # user 0 has degree 2, user 1 degree 1, item 0 degree 1, item 1 degree 2 (nodes 2 and 3)
    assert dense[0, 3].item() == pytest.approx(1 / 2) and dense[1, 3].item() == pytest.approx(1 / 2 ** 0.5)
    assert dense[0, 2].item() == pytest.approx(1 / 2 ** 0.5) and dense[1, 2].item() == 0
