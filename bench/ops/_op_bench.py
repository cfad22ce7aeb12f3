"""What the per-op benchmarks share: one ML-1M-sized batch per device, and the step that checks the
fused op against the reference before timing one of them.

The batch (:func:`ml1m_batch`) comes from ``bench/_harness.synthetic_problem``: 6,040 users and
3,706 items, as ML-1M, each user knowing 165 uniformly drawn items (ML-1M's mean, 1,000,209
ratings over 6,040 users, without its long tail); float32 tables with d = 64 on the harness's 1/64
grid, on which every score is exact, so both backends select the same candidates; B = 2048
(user, known item) rows. On top of it: K = 8 unknown items per row (the sampled candidates and BPR
negatives) with the uniform draws that chose them, the same for K = 800 (SL's negatives), and L = 50
draws for the history sample. It is
built on the CPU and copied, so every device sees the same values.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for _harness
from _harness import synchronize, synthetic_problem

from pnn_fast import build_info
from pnn_fast._extension import has_kernels
from pnn_fast.backends import reference
from pnn_fast.known import KnownPositives

if not build_info()["compiled"]:
    pytest.skip(build_info()["reason"], allow_module_level=True)
from pnn_fast import ops  # noqa: E402  (needs the compiled kernels)

NUM_USERS, NUM_ITEMS, KNOWN_PER_USER = 6040, 3706, 165
DIM, BATCH, PER_ROW, SL_PER_ROW, HISTORY = 64, 2048, 8, 800, 50
GOWALLA_ITEMS = 40981  # the item table of SL's Gowalla runs: 10 MB, beyond this CPU's L2

BACKENDS = ("reference", "fused")
PASSES = ("forward", "forward+backward")
#: a row op's candidates: the batch's positives shared by every row (the paper's in-batch scheme), or K per row
CANDIDATES = ("in-batch-2048", "per-row-8")

_CUDA_READY = torch.cuda.is_available() and has_kernels("cuda")
_NO_CUDA = "no CUDA device" if not torch.cuda.is_available() else "pnn_fast._C was built without CUDA kernels"
DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _CUDA_READY, reason=_NO_CUDA)))

#: fused against reference for float results ("to rounding"); ids, counts and masks must be equal
FLOAT_TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
EXACT = {"rtol": 0, "atol": 0}


@dataclasses.dataclass(frozen=True)
class OpInputs:
    """One batch's inputs on one device (shapes in the module docstring's sizes)."""

    known: KnownPositives  # [6040 users x 3706 items]
    users: torch.Tensor  # int64 [B]
    pos_items: torch.Tensor  # int64 [B], a known item of each row's user
    user_table: torch.Tensor  # float32 [6040, d]
    item_table: torch.Tensor  # float32 [3706, d]
    unknown_draws: torch.Tensor  # float32 [B, K] in [0, 1)
    sampled_items: torch.Tensor  # int64 [B, K], the unknown items those draws choose
    history_draws: torch.Tensor  # float32 [B, L] in [0, 1)
    sl_draws: torch.Tensor  # float32 [B, 800] in [0, 1)
    sl_items: torch.Tensor  # int64 [B, 800], the unknown items those draws choose

    def draws(self, per_row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(uniform draws float32 [B, per_row], the unknown items they choose int64 [B, per_row]), per_row 8 or 800."""
        return {PER_ROW: (self.unknown_draws, self.sampled_items), SL_PER_ROW: (self.sl_draws, self.sl_items)}[per_row]

    @property
    def user_emb(self) -> torch.Tensor:
        """float32 [B, d], each row's user embedding."""
        return self.user_table[self.users]

    def candidates(self, kind: str) -> torch.Tensor:
        """int64 [B] (``"in-batch-2048"``: the positives) or [B, K] (``"per-row-8"``: the sampled items)."""
        return {"in-batch-2048": self.pos_items, "per-row-8": self.sampled_items}[kind]

    def row_args(self, kind: str) -> tuple:
        """``(user_emb, item_table, users, pos_items, candidates, known)``, the arguments of the row ops."""
        return self.user_emb, self.item_table, self.users, self.pos_items, self.candidates(kind), self.known

    def to(self, device: str) -> "OpInputs":
        return OpInputs(**{field.name: getattr(self, field.name).to(device) for field in dataclasses.fields(self)})


@functools.lru_cache(maxsize=None)
def ml1m_batch(device: str) -> OpInputs:
    """The batch of the module docstring on ``device``, built once per process."""
    problem = synthetic_problem(BATCH, DIM, "cpu", num_users=NUM_USERS, num_items=NUM_ITEMS,
                                per_user=KNOWN_PER_USER)
    generator = torch.Generator().manual_seed(1)
    unknown_draws = torch.rand(BATCH, PER_ROW, generator=generator)
    history_draws = torch.rand(BATCH, HISTORY, generator=generator)
    sl_draws = torch.rand(BATCH, SL_PER_ROW, generator=generator)
    sampled_items = reference.unknown_items(problem["known"], problem["users"], unknown_draws)
    sl_items = reference.unknown_items(problem["known"], problem["users"], sl_draws)
    return OpInputs(problem["known"], problem["users"], problem["pos_items"], problem["user_table"],
                    problem["item_table"], unknown_draws, sampled_items, history_draws, sl_draws, sl_items).to(device)


def run_pass(fn, args: tuple, backward_wrt: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """``fn(*args)`` as a tuple of tensors; with ``backward_wrt`` (positions in ``args``), those
    arguments become leaves requiring grad and the tuple ends with the gradients, w.r.t. them, of
    the sum of every differentiable output (a backward with cotangents of ones)."""
    args = list(args)
    leaves = []
    for position in backward_wrt:
        args[position] = args[position].detach().requires_grad_()
        leaves.append(args[position])
    outputs = fn(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    if not leaves:
        return outputs
    differentiable = [output for output in outputs if output.requires_grad]
    grads = torch.autograd.grad(differentiable, leaves, [torch.ones_like(output) for output in differentiable])
    return tuple(output.detach() for output in outputs) + grads


def check_then_time(benchmark, device: str, backend: str, reference_fn, fused_fn, args: tuple, *,
                    passes: str = "forward", wrt: tuple[int, ...] = ()) -> None:
    """Fail unless ``fused_fn`` gives ``reference_fn``'s results on ``args``, then time ``backend``'s.

    ``passes``: ``"forward"`` runs the function on ``args`` as they are (nothing requires grad);
    ``"forward+backward"`` also differentiates w.r.t. the arguments at positions ``wrt``
    (:func:`run_pass`), and the check covers the gradients too. Float results must agree to
    ``FLOAT_TOLERANCE``, all others exactly. The timed call ends with a CUDA synchronisation.
    Benchmarks differing only in the backend share a group, so they are reported side by side.
    """
    backward_wrt = wrt if passes == "forward+backward" else ()
    fused_results = run_pass(fused_fn, args, backward_wrt)
    reference_results = run_pass(reference_fn, args, backward_wrt)
    assert len(fused_results) == len(reference_results), "the two backends return different numbers of results"
    for index, (got, want) in enumerate(zip(fused_results, reference_results)):
        tolerance = FLOAT_TOLERANCE if want.is_floating_point() else EXACT
        torch.testing.assert_close(got, want, **tolerance, msg=lambda message, index=index: f"result {index}: {message}")

    timed_fn = {"reference": reference_fn, "fused": fused_fn}[backend]
    sync_device = torch.device(device)

    def timed():
        results = run_pass(timed_fn, args, backward_wrt)
        synchronize(sync_device)
        return results

    case = "-".join(str(value) for name, value in benchmark.params.items() if name != "backend")
    benchmark.group = f"{benchmark.name.partition('[')[0].removeprefix('test_')}[{case}]"
    benchmark(timed)
