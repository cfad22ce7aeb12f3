"""pnn_fast::dot_topk (CPU), each user row's k best items by dot product, block by block: equal to
masked_topk of the whole product on integer-valued embeddings (exact products, many ties), at
block widths from 1 item to the whole catalog, with excluded items, a first block whose sample
misleads the threshold and items that all users exclude on top; continuous inputs against the
chunked ranking to rounding; independent of the thread count; NaN and bad input named; opcheck."""
from __future__ import annotations

import math

import pytest
import torch

from batches import requires_kernels, under_thread_counts
from pnn_fast import _extension
from pnn_fast.backends import reference
from pnn_fast.csr import CSR

pytestmark = requires_kernels

if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def random_exclusions(num_users: int, num_items: int, share: float, seed: int) -> CSR:
    g = torch.Generator().manual_seed(seed)
    users, items = (torch.rand(num_users, num_items, generator=g) < share).nonzero(as_tuple=True)
    return CSR.from_pairs(users, items, num_users, num_items)


def integer_problem(rows: int, items: int, dim: int, seed: int, dtype=torch.float64, layout: str = "random"):
    """Small-integer embeddings, so that every product is exact whatever the block: (user_rows,
    item_table, users, exclude).  Layouts: "best_at_sampled_columns" boosts every 16th item (the
    first block's sample then sees only the row's best); "excluded_on_top" boosts items that every
    user excludes, as a trained model scores its training items."""
    g = torch.Generator().manual_seed(seed)
    user_rows = torch.randint(-3, 4, (rows, dim), generator=g).to(dtype)
    item_table = torch.randint(-3, 4, (items, dim), generator=g).to(dtype)
    num_users = max(rows // 2, 1)
    users = torch.randint(0, num_users, (rows,), generator=g)
    exclude = [random_exclusions(num_users, items, 0.2, seed + 1), random_exclusions(num_users, items, 0.05, seed + 2)]
    if layout != "random":
        user_rows[:, 0] = 1.0
        boosted = torch.arange(0, items, 16) if layout == "best_at_sampled_columns" else torch.arange(3, items, 5)
        item_table[boosted, 0] = 40.0
        if layout == "excluded_on_top":
            pairs = torch.cartesian_prod(torch.arange(num_users), boosted)
            exclude.append(CSR.from_pairs(pairs[:, 0], pairs[:, 1], num_users, items))
    return user_rows, item_table, users, exclude


def expected(user_rows, item_table, users, exclude, k):
    return reference.masked_topk(user_rows @ item_table.T, users, exclude, k)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("block_items", [0, 1, 7, 64, 300, 5000])
@pytest.mark.parametrize("layout", ["random", "best_at_sampled_columns", "excluded_on_top"])
def test_matches_masked_topk_of_the_whole_product(dtype, block_items, layout):
    user_rows, item_table, users, exclude = integer_problem(37, 1500, 8, seed=block_items + 3, dtype=dtype, layout=layout)
    for k in (1, 20, 333, 1500):
        values, items = ops.dot_topk(user_rows, item_table, users, exclude, k, block_items)
        want_values, want_items = expected(user_rows, item_table, users, exclude, k)
        assert torch.equal(items, want_items), (k, block_items, layout)
        assert torch.equal(values, want_values), (k, block_items, layout)


def test_many_blocks_of_the_op_s_own_width():
    """A catalog of many automatic blocks (at least 256 items each), rows whose threshold carries
    over from block to block."""
    user_rows, item_table, users, exclude = integer_problem(300, 20_000, 16, seed=5, dtype=torch.float32)
    values, items = ops.dot_topk(user_rows, item_table, users, exclude, 20)
    want_values, want_items = expected(user_rows, item_table, users, exclude, 20)
    assert torch.equal(items, want_items) and torch.equal(values, want_values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_continuous_embeddings_rank_as_the_chunked_products_do(dtype):
    """Continuous inputs: the values equal the whole product's to rounding (a block's product may
    round an ulp differently), and the items agree."""
    g = torch.Generator().manual_seed(6)
    user_rows, item_table = torch.randn(50, 32, generator=g), torch.randn(3000, 32, generator=g)
    users = torch.arange(50)
    exclude = [random_exclusions(50, 3000, 0.1, seed=7)]
    user_rows, item_table = user_rows.to(dtype), item_table.to(dtype)
    values, items = ops.dot_topk(user_rows, item_table, users, exclude, 20, 256)
    want_values, want_items = expected(user_rows.double(), item_table.double(), users, exclude, 20)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(values.double(), want_values, **tolerance)
    if dtype == torch.float32:  # bfloat16's products tie and reorder at its rounding
        assert torch.equal(items, want_items)


def test_results_do_not_depend_on_the_thread_count():
    user_rows, item_table, users, exclude = integer_problem(200, 3000, 8, seed=8, dtype=torch.float32)
    results = under_thread_counts((1, 2, 4), lambda: ops.dot_topk(user_rows, item_table, users, exclude, 20, 500))
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_a_nan_is_an_error_unless_excluded():
    user_rows, item_table, users, _ = integer_problem(3, 600, 4, seed=9)
    item_table[450, 1] = math.nan  # in the second block of 300: past the first block's sample
    with pytest.raises(ValueError, match="row 0 have a NaN at an item that is not excluded"):
        ops.dot_topk(user_rows, item_table, users, [], 4, 300)
    everyone = CSR.from_pairs(torch.arange(2), torch.full((2,), 450), 2, 600)
    values, items = ops.dot_topk(user_rows, item_table, users, [everyone], 600, 300)
    assert (items[:, -1] == 450).all() and (values[:, -1] == -math.inf).all()


def test_a_user_with_every_item_excluded_lists_them_in_item_order():
    user_rows, item_table = torch.randn(2, 4), torch.randn(5, 4)
    everything = CSR.from_pairs(torch.zeros(5, dtype=torch.int64), torch.arange(5), 2, 5)
    values, items = ops.dot_topk(user_rows, item_table, torch.tensor([0, 1]), [everything], 3, 2)
    assert items[0].tolist() == [0, 1, 2] and values[0].tolist() == [-math.inf] * 3
    assert torch.equal(items[1], (user_rows[1] @ item_table.T).topk(3).indices)


def test_tables_that_require_grad_are_ranked_as_plain_ones():
    """A model's weights (requires_grad) outside no_grad: the op's products stay out of autograd."""
    user_rows, item_table, users, exclude = integer_problem(5, 400, 4, seed=11, dtype=torch.float32)
    got = ops.dot_topk(user_rows.requires_grad_(), item_table.requires_grad_(), users, exclude, 10, 64)
    want = expected(user_rows.detach(), item_table.detach(), users, exclude, 10)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_strided_tables_are_read_in_place_of_copies():
    user_rows, item_table, users, exclude = integer_problem(6, 500, 8, seed=12, dtype=torch.float32)
    got = ops.dot_topk(user_rows[::2, ::2], item_table[:, ::2], users[::2], exclude, 10, 64)
    want = expected(user_rows[::2, ::2].contiguous(), item_table[:, ::2].contiguous(), users[::2], exclude, 10)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_no_rows_give_empty_results():
    values, items = ops.dot_topk(torch.randn(0, 4), torch.randn(5, 4), torch.zeros(0, dtype=torch.int64), [], 3)
    assert values.shape == (0, 3) and items.shape == (0, 3)


def test_bad_input_is_a_clear_error():
    user_rows, item_table, users = torch.randn(2, 4), torch.randn(5, 4), torch.tensor([0, 1])
    empty = CSR(torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2, 5)
    with pytest.raises(ValueError, match=r"k must lie in \[1, I\] = \[1, 5\], got 6"):
        ops.dot_topk(user_rows, item_table, users, [], 6)
    with pytest.raises(ValueError, match="block_items must be >= 0"):
        ops.dot_topk(user_rows, item_table, users, [], 2, -1)
    with pytest.raises(ValueError, match="at most 8 exclusion sets, got 9"):
        ops.dot_topk(user_rows, item_table, users, [empty] * 9, 2)
    with pytest.raises(RuntimeError, match=r"item_table must have shape \[-1, 4\]"):
        ops.dot_topk(user_rows, item_table[:, :3], users, [], 2)
    with pytest.raises(RuntimeError, match="item_table must be Float, got Double"):
        ops.dot_topk(user_rows, item_table.double(), users, [], 2)
    with pytest.raises(RuntimeError, match=r"user_rows must be a floating-point \[T, d\] tensor"):
        ops.dot_topk(user_rows[0], item_table, users, [], 2)
    with pytest.raises(RuntimeError, match=r"rows must have shape \[2\]"):
        ops.dot_topk(user_rows, item_table, users[:1], [], 2)
    with pytest.raises(ValueError, match="item_table is on meta but user_rows is on cpu"):
        ops.dot_topk(user_rows, item_table.to("meta"), users, [], 2)


def opcheck_cases(device: str) -> list:
    """(op, args) for the op's schema: a CPU kernel only (CUDA ranks chunks with masked_topk)."""
    if device != "cpu":
        return []
    user_rows, item_table, users, exclude = integer_problem(6, 40, 4, seed=10, dtype=torch.float32)
    return [(torch.ops.pnn_fast.dot_topk.default,
             [user_rows, item_table, users, [e.indptr for e in exclude], [e.indices for e in exclude], 7, 16])]
