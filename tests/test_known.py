"""pnn_fast.known: KnownPositives, the users' known items as a CSR, its queries and its argument checks."""
import pytest
import torch

from pnn_fast import KnownPositives


def test_known_positives_csr_and_queries():
    users = torch.tensor([2, 0, 2, 2, 0])
    items = torch.tensor([4, 1, 0, 4, 3])  # (2, 4) twice
    known = KnownPositives.from_pairs(users, items, 4, 5)
    assert known.indptr.tolist() == [0, 2, 2, 4, 4]
    assert known.indices.tolist() == [1, 3, 0, 4]
    assert known.count(torch.tensor([0, 1, 2, 3])).tolist() == [2, 0, 2, 0]
    q_users = torch.tensor([[0], [2], [3]])
    q_items = torch.tensor([[0, 1, 3, 4]])
    assert known.contains(q_users, q_items).tolist() == [
        [False, True, True, False], [True, False, False, True], [False, False, False, False]]
    assert known.to("cpu") is known
    with pytest.raises(ValueError, match="item_ids"):
        KnownPositives.from_pairs(torch.tensor([0]), torch.tensor([5]), 1, 5)
    with pytest.raises(ValueError, match="user_ids"):
        KnownPositives.from_pairs(torch.tensor([-1]), torch.tensor([0]), 1, 5)
    with pytest.raises(ValueError, match="sorted"):
        KnownPositives(torch.tensor([0, 2]), torch.tensor([3, 1]), 1, 5)
    with pytest.raises(ValueError, match="indptr"):
        KnownPositives(torch.tensor([0, 2]), torch.tensor([1, 3]), 2, 5)
