"""The drop-in examples of the README (PNNLoss) and of docs/guide.md (SampledSoftmaxLoss, and DNSLoss with
sparse=True) in a bare MF model run as written and train: their loss falls over repeated steps on one
batch of the built-in synthetic data."""
import re
from pathlib import Path

import pytest
import torch

from pnn_fast import DNSLoss, PNNLoss, SampledSoftmaxLoss
from pnn_fast.data import synthetic_dataset

ROOT = Path(__file__).resolve().parents[1]
README, GUIDE = ROOT / "README.md", ROOT / "docs" / "guide.md"


def example(document: Path, title: str) -> str:
    """The first python code block of ``document``'s section titled ``title``."""
    section = document.read_text().split(title + "\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("document, title", [(README, "## Drop PNNLoss into an existing MF model"),
                                             (GUIDE, "## Sampled softmax, the loss that gave the lift"),
                                             (GUIDE, "## Large catalogs")])
def test_drop_in_example_runs_and_its_loss_falls(document, title):
    data = synthetic_dataset()
    users, items = data.train
    torch.manual_seed(0)
    batch = torch.randperm(users.numel())[:1024]
    losses = []

    def record(module, args, output):
        if isinstance(module, (PNNLoss, SampledSoftmaxLoss, DNSLoss)):
            losses.append(float(output.detach()))

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        namespace = {"train_users": users, "train_items": items, "num_users": data.num_users,
                     "num_items": data.num_items, "loader": [(users[batch], items[batch])] * 40}
        exec(compile(example(document, title), str(document), "exec"), namespace)
    finally:
        hook.remove()
    # 40 steps an epoch (the README's example runs two, with a check after each)
    assert len(losses) in (40, 80) and all(map(torch.isfinite, torch.tensor(losses)))
    # Adam at 1e-3 on one batch: the last steps' mean sits clearly below the first steps'
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.01 * abs(first), (first, last)
    if "scores" in namespace:
        assert namespace["scores"].shape == (data.num_users, data.num_items)
    if getattr(namespace["loss_fn"], "sparse", False):  # the last step's gradients, for SparseAdam
        assert namespace["users_emb"].weight.grad.is_sparse and namespace["items_emb"].weight.grad.is_sparse
