"""Every op rejects out-of-range ids with a one-line error, on every device, and never indexes outside
its inputs.

The ops of a loss step test their ids on the device and record a deferred error, with no read-back
(csrc/common/checks.h): the id is clamped into range, and ``check_kernel_inputs`` raises. The
evaluator's masked_topk checks on the host before launching. Neither fires a
device-side assert, which would leave the CUDA context unusable for the rest of the process, so on
CUDA the test also runs a valid op after the errors and checks its result.
"""
from __future__ import annotations

import pytest
import torch

from batches import DEVICES, bpr_inputs, deferred_error, make_batch, raw_args, requires_kernels
from pnn_fast import CSR, KnownPositives, _extension
from pnn_fast.backends import reference

pytestmark = requires_kernels
if _extension.has_kernels("cpu"):
    from pnn_fast import ops


def bad_calls(device: str) -> list:
    """(name, call, message): one call per op with an id outside its table (the draw ops'
    invalid draws: tests/ops/test_unknown_items.py, tests/ops/test_history_sample.py); the last,
    the evaluator's masked_topk, raises at once, the others record a deferred error."""
    pnn = torch.ops.pnn_fast
    args = raw_args(make_batch(6, 4, per_row=5, num_items=20, seed=6, device=device))
    k = torch.ones(6, dtype=torch.int64, device=device)
    with_users = lambda users: args[:2] + [users] + args[3:]  # noqa: E731
    with_candidates = lambda candidates: args[:4] + [candidates] + args[5:]  # noqa: E731
    user_table, item_table, users, pos, neg = bpr_inputs(device=device, rows=5)
    table = torch.randn(10, 5, dtype=torch.float64, device=device)
    scores = torch.randn(2, 5, device=device)
    no_exclusions = CSR(torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2, 5).to(device)
    return [
        ("count_unlabeled users", lambda: pnn.count_unlabeled(*with_users(args[2] + 1000)), "users has ids outside"),
        ("count_unlabeled pos_items", lambda: pnn.count_unlabeled(*args[:3], args[3] - 100, *args[4:]),
         "pos_items has ids outside"),
        ("hard_negative_argmax candidates", lambda: pnn.hard_negative_argmax(*with_candidates(args[4] + 1000)),
         "candidates has ids outside"),
        ("class_centroids_fwd candidates", lambda: pnn.class_centroids_fwd(*with_candidates(args[4] - 1000), k, 0),
         "candidates has ids outside"),
        ("embedding_bpr_fwd neg_items", lambda: pnn.embedding_bpr_fwd(user_table, item_table, users, pos, neg - 100, 0.0),
         "neg_items has ids outside"),
        ("gathered_dots ids", lambda: ops.gathered_dots(table[:2], table, torch.full((2, 3), 10, device=device)),
         "ids has ids outside"),
        ("gathered_norm ids", lambda: ops.gathered_norm(table, torch.tensor([3, -1], device=device)),
         "ids has ids outside"),
        ("rows_contain rows", lambda: ops.rows_contain(no_exclusions, torch.tensor([2, 0], device=device),
                                                       torch.zeros(2, 3, dtype=torch.int64, device=device)),
         "rows has ids outside"),
        ("masked_topk rows", lambda: ops.masked_topk(scores, torch.tensor([0, 2], device=device), [no_exclusions], 2),
         "rows has ids outside"),
    ]


EVALUATOR_OPS = 1  # the last call of bad_calls: checked on the host before launch


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_ids_are_one_line_errors(device):
    calls = bad_calls(device)
    for name, call, message in calls[:-EVALUATOR_OPS]:
        with deferred_error(r"^pnn_fast::\w+: " + message + r" \[0, [1-9][0-9]*\)$", device):
            call()
    for name, call, message in calls[-EVALUATOR_OPS:]:
        # the bound in full: a message cut short at the number was the sign of a second C++ runtime
        # in the extension (tests/test_build.py::test_extension_links_the_shared_cxx_runtime)
        with pytest.raises(RuntimeError, match=message + r" \[0, [1-9][0-9]*\)$") as info:
            call()
        first_line = str(info.value).splitlines()[0]
        assert "pnn_fast::" in first_line and "Exception raised from" not in first_line, name
    # The context is still usable (no device-side assert fired): a valid op gives the right value.
    if device == "cuda":
        torch.cuda.synchronize()
    table = torch.randn(10, 5, dtype=torch.float64, device=device)
    ids = torch.tensor([3, 3, 9], device=device)
    torch.testing.assert_close(ops.gathered_norm(table, ids), reference.gathered_norm(table, ids))


@pytest.mark.cuda
@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device and the CUDA kernels")
def test_checked_ops_capture_into_a_cuda_graph():
    """A read-back is not allowed while a stream captures a CUDA graph (torch.compile's
    mode="reduce-overhead" captures one): the id and draw checks of a step's ops read nothing back, so
    they run inside the capture, and the replays compute from the inputs' current values; a bad id
    given to a replay is clamped and recorded."""
    table = torch.randn(10, 5, dtype=torch.float64, device="cuda")
    ids = torch.tensor([3, 3, 9], device="cuda")
    known = KnownPositives.from_pairs(torch.tensor([0, 0, 1, 1, 1]), torch.tensor([1, 4, 0, 2, 3]), 2, 5).to("cuda")
    users = torch.tensor([1, 0], device="cuda")
    uniform = torch.rand(2, 2, device="cuda")

    def step():
        return ops.gathered_norm(table, ids), ops.history_sample(known, users, uniform)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # the warm-up, checked
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm, sample = step()
    for new_ids, new_users in (([9, 0, 1], [0, 1]), ([2, 2, 2], [1, 1])):
        ids.copy_(torch.tensor(new_ids))
        users.copy_(torch.tensor(new_users))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(norm, reference.gathered_norm(table, ids))
        assert torch.equal(sample, reference.history_sample(known, users, uniform))
    with deferred_error(r"ids has ids outside \[0, 10\)$", "cuda"):  # recorded by a replay
        ids.copy_(torch.tensor([10, 0, 1]))
        graph.replay()
    torch.testing.assert_close(norm, reference.gathered_norm(table, torch.tensor([9, 0, 1], device="cuda")))
