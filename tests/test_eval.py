"""Evaluator: hand-computed metrics, tie order, batching, and a slow per-user reference."""
import math
from types import SimpleNamespace

import pytest
import torch

from pnn_fast import _extension
from pnn_fast.csr import CSR
from pnn_fast.eval import evaluate
from pnn_fast.known import KnownPositives

KS = (2, 5)
#: who ranks: the reference and the compiled CPU kernels (pnn_fast.ops.dot_topk) where they are built
BACKENDS = ["reference"] + (["cpu"] if _extension.has_kernels("cpu") else [])


def _pairs(rows: dict[int, list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    users = [u for u, items in rows.items() for _ in items]
    items = [i for items in rows.values() for i in items]
    return torch.tensor(users, dtype=torch.int64), torch.tensor(items, dtype=torch.int64)


def _score_tables(scores: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables whose dot products are exactly ``scores`` (item table = identity)."""
    s = torch.tensor(scores, dtype=torch.float32)
    return s, torch.eye(s.shape[1])


def _ndcg(hit_positions: list[int], n_truth: int, k: int) -> float:
    dcg = sum(1 / math.log2(p + 1) for p in hit_positions if p <= k)
    return dcg / sum(1 / math.log2(j + 1) for j in range(1, min(n_truth, k) + 1))


def slow_evaluate(user_table, item_table, truth: dict, excluded: dict, ks) -> dict[str, float]:
    """Per-user loop: rank candidates by (-score, item id), RecBole's formulas written out."""
    scores = (user_table.double() @ item_table.double().T).tolist()
    totals: dict[str, float] = {}
    users = [u for u in range(len(scores)) if truth.get(u)]
    for u in users:
        relevant = set(truth[u])
        candidates = [i for i in range(len(scores[u])) if i not in excluded.get(u, set())]
        ranking = sorted(candidates, key=lambda i: (-scores[u][i], i))
        for k in ks:
            top = ranking[:k]
            positions = [p + 1 for p, item in enumerate(top) if item in relevant]
            found = len(positions)
            values = {
                "recall": found / len(relevant),
                "precision": found / k,
                "hit": float(found > 0),
                "ndcg": _ndcg(positions, len(relevant), k),
                "mrr": 1 / positions[0] if positions else 0.0,
            }
            for name, v in values.items():
                totals[f"{name}@{k}"] = totals.get(f"{name}@{k}", 0.0) + v
    return {key: v / len(users) for key, v in totals.items()}


def _as_sets(pairs) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for u, i in zip(pairs[0].tolist(), pairs[1].tolist()):
        out.setdefault(u, set()).add(i)
    return out


# Four users, six items; scores are the table rows.
HAND_SCORES = [
    [5, 4, 3, 2, 1, 0],  # u0: item 0 best but excluded (train); truth {2, 5}
    [9, 9, 9, 9, 9, 9],  # u1: no ground truth -> not averaged
    [1, 1, 1, 1, 0, 0],  # u2: four-way tie, truth {3}: ties by id put item 3 at position 4
    [0, 0, 0, 0, 0, 9],  # u3: one truth item {5} ranked first (fewer truth items than K)
]
HAND_TRUTH = {0: [2, 5], 2: [3], 3: [5]}
HAND_TRAIN = {0: [0], 1: [2]}


def _hand_expected() -> dict[str, float]:
    l3, l5, l6 = 1 / math.log2(3), 1 / math.log2(5), 1 / math.log2(6)
    per_user = {  # (recall, precision, hit, ndcg, mrr) at k = 2 and k = 5
        0: {2: (1 / 2, 1 / 2, 1, l3 / (1 + l3), 1 / 2), 5: (1, 2 / 5, 1, (l3 + l6) / (1 + l3), 1 / 2)},
        2: {2: (0, 0, 0, 0, 0), 5: (1, 1 / 5, 1, l5, 1 / 4)},
        3: {2: (1, 1 / 2, 1, 1, 1), 5: (1, 1 / 5, 1, 1, 1)},
    }
    expected = {}
    for idx, name in enumerate(("recall", "precision", "hit", "ndcg", "mrr")):
        for k in KS:
            expected[f"{name}@{k}"] = sum(per_user[u][k][idx] for u in per_user) / 3
    return expected


@pytest.mark.parametrize("batch_size", [1, 2, 1024])
def test_hand_computed_metrics(batch_size):
    users, items = _score_tables(HAND_SCORES)
    got = evaluate(users, items, _pairs(HAND_TRUTH), [_pairs(HAND_TRAIN)], ks=KS, batch_size=batch_size)
    expected = _hand_expected()
    assert set(got) == set(expected)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key


def test_result_keys_follow_metrics_then_ks():
    users, items = _score_tables(HAND_SCORES)
    got = evaluate(users, items, _pairs(HAND_TRUTH), ks=(5, 2), metrics=("mrr", "hit"))
    assert list(got) == ["mrr@5", "mrr@2", "hit@5", "hit@2"]


def test_excluded_items_are_never_ranked():
    # User 0's only truth item has the top score but is also excluded: it must not count as a hit,
    # yet it still counts in |R_u| (RecBole's pos_len); user 1 has a single candidate item left,
    # the -inf fillers of its top-5 must not count either.
    users, items = _score_tables([[9, 1, 0, 0], [9, 8, 7, 1]])
    truth = _pairs({0: [0, 3], 1: [0, 1, 3]})
    exclude = _pairs({0: [0], 1: [0, 1, 2]})
    got = evaluate(users, items, truth, exclude, ks=(1, 5))
    # u0 ranking: 1, 2, 3 (ties by id) -> hit at position 3; u1 ranking: 3 -> hit at position 1.
    assert got["recall@1"] == pytest.approx((0 + 1 / 3) / 2)
    assert got["recall@5"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert got["precision@5"] == pytest.approx((1 / 5 + 1 / 5) / 2)
    assert got["mrr@5"] == pytest.approx((1 / 3 + 1) / 2)
    assert got["ndcg@5"] == pytest.approx(((1 / math.log2(4)) / (1 + 1 / math.log2(3)) + 1 / (1 + 1 / math.log2(3) + 1 / math.log2(4))) / 2)


def test_exclude_accepts_single_set_and_several():
    users, items = _score_tables(HAND_SCORES)
    truth = _pairs(HAND_TRUTH)
    train = _pairs(HAND_TRAIN)
    base = evaluate(users, items, truth, [train], ks=KS)
    assert evaluate(users, items, truth, train, ks=KS) == base
    split = (_pairs({0: [0]}), _pairs({1: [2]}))
    assert evaluate(users, items, truth, split, ks=KS) == base
    assert evaluate(users, items, truth, ks=KS) != base  # the exclusion matters for u0


def test_known_positives_and_pairs_agree():
    users, items = _score_tables(HAND_SCORES)
    truth, train = _pairs(HAND_TRUTH), _pairs(HAND_TRAIN)
    known_truth = KnownPositives.from_pairs(*truth, num_users=4, num_items=6)
    known_train = KnownPositives.from_pairs(*train, num_users=4, num_items=6)
    assert evaluate(users, items, known_truth, [known_train], ks=KS) == evaluate(users, items, truth, [train], ks=KS)


def test_k_larger_than_item_count():
    users, items = _score_tables([[3, 2, 1]])
    got = evaluate(users, items, _pairs({0: [2]}), ks=(10,))
    assert got["recall@10"] == 1.0
    assert got["precision@10"] == pytest.approx(1 / 10)
    assert got["mrr@10"] == pytest.approx(1 / 3)
    assert got["ndcg@10"] == pytest.approx(1 / math.log2(4))


def test_no_user_with_ground_truth_gives_nan():
    users, items = _score_tables([[1, 2], [3, 4]])
    empty = (torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    got = evaluate(users, items, empty, ks=(1,), metrics=("recall",))
    assert math.isnan(got["recall@1"])


def _random_case(seed: int, num_users=37, num_items=23, dim=4, integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:  # small integers: exact products and many tied scores
        users = torch.randint(-1, 2, (num_users, dim), generator=g).float()
        items = torch.randint(-1, 2, (num_items, dim), generator=g).float()
    else:
        users, items = torch.randn(num_users, dim, generator=g), torch.randn(num_items, dim, generator=g)
    n = num_users * 4
    # Users >= num_users - 3 get no truth at all.
    truth = (torch.randint(0, num_users - 3, (n,), generator=g), torch.randint(0, num_items, (n,), generator=g))
    train = (torch.randint(0, num_users, (2 * n,), generator=g), torch.randint(0, num_items, (2 * n,), generator=g))
    valid = (torch.randint(0, num_users, (n,), generator=g), torch.randint(0, num_items, (n,), generator=g))
    return users, items, truth, [train, valid]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_slow_reference(seed, integer, backend):
    users, items, truth, exclude = _random_case(seed, integer=integer)
    ks = (1, 3, 10, 30)
    excluded: dict[int, set[int]] = {}
    for pairs in exclude:
        for u, s in _as_sets(pairs).items():
            excluded.setdefault(u, set()).update(s)
    expected = slow_evaluate(users, items, _as_sets(truth), excluded, ks)
    got = evaluate(users, items, truth, exclude, ks=ks, batch_size=8, backend=backend)
    assert set(got) == set(expected)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], abs=1e-9), key


@pytest.mark.parametrize("backend", BACKENDS)
def test_tie_order_forced_at_the_boundary(backend):
    # Ten tied items for a top-3; ties go to the lowest ids whichever order topk returned.
    users, items = _score_tables([[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
    got = evaluate(users, items, _pairs({0: [3, 9]}), ks=(3,), metrics=("recall", "mrr"), backend=backend)
    assert got == {"recall@3": 0.5, "mrr@3": pytest.approx(1 / 3)}


def test_tie_order_does_not_depend_on_topk_internals(monkeypatch):
    # A torch.topk that breaks ties towards the highest ids is as valid as any other; the
    # evaluator must still rank tied items by ascending id.
    def topk_highest_id_first(x, k, dim=-1):
        values, order = torch.sort(x.flip(1), dim=1, descending=True, stable=True)
        return values[:, :k], x.shape[1] - 1 - order[:, :k]

    users, items, truth, exclude = _random_case(3, integer=True)
    expected = evaluate(users, items, truth, exclude, ks=(1, 4, 9), backend="reference")
    monkeypatch.setattr(torch, "topk", topk_highest_id_first)
    assert evaluate(users, items, truth, exclude, ks=(1, 4, 9), backend="reference") == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("integer", [False, True])
def test_batch_size_does_not_change_results(integer, backend):
    users, items, truth, exclude = _random_case(7, num_users=61, integer=integer)
    one = evaluate(users, items, truth, exclude, ks=(5, 20), batch_size=1, backend=backend)
    for batch_size in (3, 16, 4096):
        other = evaluate(users, items, truth, exclude, ks=(5, 20), batch_size=batch_size, backend=backend)
        assert other == pytest.approx(one, abs=1e-12)


def test_does_not_track_gradients():
    users = torch.randn(5, 3, requires_grad=True)
    items = torch.randn(4, 3, requires_grad=True)
    got = evaluate(users, items, _pairs({0: [1], 3: [2]}), ks=(2,))
    assert all(isinstance(v, float) for v in got.values())
    assert users.grad is None


def test_argument_errors():
    users, items = _score_tables(HAND_SCORES)
    truth = _pairs(HAND_TRUTH)
    with pytest.raises(ValueError, match="unknown metric"):
        evaluate(users, items, truth, metrics=("auc",))
    with pytest.raises(ValueError, match="ks"):
        evaluate(users, items, truth, ks=(0,))
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(users, items, truth, batch_size=0)
    with pytest.raises(ValueError, match="share d"):
        evaluate(users, items[:, :3], truth)
    with pytest.raises(ValueError, match="indices"):
        evaluate(users, items, _pairs({0: [6]}))
    with pytest.raises(ValueError, match="indptr"):
        evaluate(users, items, CSR.from_pairs(*_pairs({0: [1]}), 3, 4))
    with pytest.raises(TypeError, match="exclude"):
        evaluate(users, items, truth, [object()])
    with pytest.raises(ValueError, match="exclude: at most 8 sets, got 9"):
        evaluate(users, items, truth, [truth] * 9)
    with pytest.raises(ValueError, match="backend must be one of"):
        evaluate(users, items, truth, backend="gpu")
    rising_wrong = SimpleNamespace(indptr=torch.tensor([0, 2, 1, 1, 2]), indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"ground_truth.indptr must rise from 0 to the number of indices \(2\)"):
        evaluate(users, items, rising_wrong)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_score_is_an_error(backend):
    users, items = _score_tables(HAND_SCORES)
    users[2, 0] = math.nan  # (user 1 has no ground truth, so is never scored)
    with pytest.raises(ValueError, match="NaN at (a column|an item) that is not excluded"):
        evaluate(users, items, _pairs(HAND_TRUTH), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsorted_csr_rows_are_sorted_first(backend):
    """A CSR-like object whose rows are unsorted or repeat an item: the same metrics as the sorted rows."""
    users, items, truth, exclude = _random_case(11, integer=True)
    sorted_truth = CSR.from_pairs(*truth, users.shape[0], items.shape[0])
    sorted_train = CSR.from_pairs(*exclude[0], users.shape[0], items.shape[0])
    expected = evaluate(users, items, sorted_truth, sorted_train, ks=(3, 10), backend=backend)
    shuffled = []
    for csr in (sorted_truth, sorted_train):
        lengths = csr.indptr[1:] - csr.indptr[:-1]
        keys = torch.repeat_interleave(torch.arange(lengths.numel()), lengths) * 1000 + torch.randperm(csr.nnz) % 1000
        shuffled.append(SimpleNamespace(indptr=csr.indptr, indices=csr.indices[torch.argsort(keys)]))
    assert any(bool((s.indices[1:] < s.indices[:-1]).any()) for s in shuffled)
    assert evaluate(users, items, shuffled[0], shuffled[1], ks=(3, 10), backend=backend) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_items_ranked_chunk_by_chunk_match_one_pass(monkeypatch, chunk, integer, backend):
    """A catalog above ITEM_CHUNK is ranked in chunks merged into a running top K (a GPU's and the
    reference's way): the same values, the same items (ties by ascending id, excluded items -inf)
    and so the same metrics as one pass (on the CPU kernels, dot_topk's)."""
    from pnn_fast import backends
    from pnn_fast import eval as eval_module
    from pnn_fast.csr import CSR

    users, items, truth, exclude = _random_case(11, integer=integer)
    num_users, num_items = users.shape[0], items.shape[0]
    ranking = backends.select(backend, users.device)
    masks = [CSR.from_pairs(u, i, num_users, num_items) for u, i in exclude]
    rows = torch.arange(num_users)
    k = 20  # above two of the chunks: a chunk's list is then shorter than the running one
    one_values, one_items = eval_module.ranked_items(ranking, users, rows, items, masks, k)
    expected = evaluate(users, items, truth, exclude, ks=(1, 3, 10, 20), batch_size=8, backend=backend)
    monkeypatch.setattr(eval_module, "ITEM_CHUNK", chunk)
    values, ranked = eval_module.ranked_in_chunks(ranking, users, rows, items, masks, k)
    # a product with fewer columns may round a score differently (continuous inputs: by an ulp)
    exact = {"rtol": 0, "atol": 0} if integer else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(values, one_values, **exact)
    finite = one_values > -math.inf  # the order of excluded fillers is not part of the contract
    assert torch.equal(ranked[finite], one_items[finite])
    got = evaluate(users, items, truth, exclude, ks=(1, 3, 10, 20), batch_size=8, backend=backend)
    assert got == pytest.approx(expected, abs=1e-12)
