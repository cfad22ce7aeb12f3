"""pnn_fast.attention: UserAwareAttention, PNN's per-user lambda, against the paper's formula
computed by loops, on the reference backend and on the compiled kernels."""
import pytest
import torch

from batches import DEVICES, requires_kernels
from pnn_fast import KnownPositives, UserAwareAttention


@pytest.mark.parametrize("backend", ["reference"] + [pytest.param(device, marks=requires_kernels) for device in DEVICES])
def test_attention_matches_the_papers_formula(backend):
    """lambda_u = sigmoid(w1 . sum_h a_h e_h), a = softmax_h(e_u . tanh(W2 e_h + b)), by loops over a
    history shorter than history_len (so it is every known item), and 0.5 for a user without one."""
    g = torch.Generator().manual_seed(11)
    known_items = {0: [1, 4, 7], 1: [0], 2: [], 3: [2, 3, 4, 5, 6, 8]}
    users = torch.tensor([u for u, its in known_items.items() for _ in its])
    known = KnownPositives.from_pairs(users, torch.tensor([i for its in known_items.values() for i in its]), 4, 9)
    att = UserAwareAttention(5, history_len=8).double()
    with torch.no_grad():
        att.bias.copy_(torch.randn(5, generator=g, dtype=torch.float64))
    item_table = torch.randn(9, 5, generator=g, dtype=torch.float64)
    batch_users = torch.tensor([3, 0, 2, 1, 3])
    user_emb = torch.randn(5, 5, generator=g, dtype=torch.float64)
    device = "cuda" if backend == "cuda" else "cpu"
    got = att.to(device)(user_emb.to(device), item_table.to(device), batch_users.to(device), known.to(device),
                         backend).cpu()
    att.cpu()
    w1, w2 = att.w1.detach(), att.w2.detach()
    for b, u in enumerate(batch_users.tolist()):
        hist = item_table[known_items[u]]
        if not known_items[u]:
            want = torch.tensor(0.5, dtype=torch.float64)
        else:
            a = torch.softmax(torch.stack([user_emb[b] @ torch.tanh(w2 @ e + att.bias.detach()) for e in hist]), 0)
            want = torch.sigmoid(w1 @ (a[:, None] * hist).sum(0))
        torch.testing.assert_close(got[b].detach(), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", ["reference"] + [pytest.param(device, marks=requires_kernels) for device in DEVICES])
def test_a_history_longer_than_the_catalog_is_the_catalogs_length(backend):
    """history_len = 10**12 (no user can know that many items) gives the same lambdas and draws as
    history_len = the catalog's size, rather than allocating 10**12 slots."""
    device = "cuda" if backend == "cuda" else "cpu"
    users = torch.tensor([0, 0, 0, 1, 2, 2])
    known = KnownPositives.from_pairs(users, torch.tensor([1, 4, 7, 0, 3, 8]), 3, 9).to(device)
    user_emb = torch.randn(4, 5, dtype=torch.float64, device=device)
    item_table = torch.randn(9, 5, dtype=torch.float64, device=device)
    batch_users = torch.tensor([2, 0, 1, 0], device=device)
    lambdas = []
    for history_len in (10**12, 9):
        torch.manual_seed(5)
        att = UserAwareAttention(5, history_len=history_len).double().to(device)
        lambdas.append(att(user_emb, item_table, batch_users, known, backend))
    torch.testing.assert_close(lambdas[0], lambdas[1], rtol=0, atol=0)
