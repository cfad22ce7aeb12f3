"""The README's PyTorch Geometric example runs as written: LightGCN trained with PNNLoss beats most-popular."""
import re
from pathlib import Path

import pytest
import torch

from conftest import data_path
from pnn_fast import PNNLoss
from pnn_fast.data import load_dataset
from pnn_fast.eval import evaluate
from test_train import popularity_ndcg

pytest.importorskip("torch_geometric", reason="the README example trains torch_geometric's LightGCN "
                                              "(install the test extras: pip install -e '.[test]')")

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION_TITLE = "## With PyTorch Geometric's LightGCN"


def readme_example() -> str:
    """The first python code block of the README section titled SECTION_TITLE."""
    section = README.read_text().split(SECTION_TITLE + "\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_readme_lightgcn_example_trains_and_beats_most_popular():
    data = load_dataset(data_path("ml-100k"), split="rs", seed=2020)
    torch.manual_seed(0)
    batch_losses = []

    def record_pnn_loss(module, inputs, loss):
        if isinstance(module, PNNLoss):
            batch_losses.append(loss.item())

    hook = torch.nn.modules.module.register_module_forward_hook(record_pnn_loss)
    try:
        namespace = {"data": data}
        exec(compile(readme_example(), str(README), "exec"), namespace)
    finally:
        hook.remove()

    window = len(batch_losses) // 10
    first, last = sum(batch_losses[:window]) / window, sum(batch_losses[-window:]) / window
    assert last < first, (first, last)

    with torch.no_grad():
        user_table, item_table = namespace["model"].get_embedding(namespace["adjacency"]).split(
            [data.num_users, data.num_items])
    ndcg = evaluate(user_table, item_table, data.test, [data.train, data.valid], ks=(20,))["ndcg@20"]
    baseline = popularity_ndcg(data)
    assert ndcg > baseline, (ndcg, baseline)
