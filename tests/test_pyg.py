"""The guide's PyTorch Geometric example (docs/guide.md) runs as written: LightGCN trained with PNNLoss beats most-popular;
that it also nearly reaches BPR is a known shortfall, marked."""
import re
from pathlib import Path

import pytest
import torch

from conftest import data_path
from pnn_fast import PNNLoss
from pnn_fast.data import load_dataset
from pnn_fast.eval import evaluate
from pnn_fast.train import TrainConfig, run
from test_train import BelowBPR, assert_reaches_bpr, popularity_ndcg

pytest.importorskip("torch_geometric", reason="the guide's example trains torch_geometric's LightGCN "
                                              "(install the test extras: pip install -e '.[test]')")

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
SECTION_TITLE = "## With PyTorch Geometric's LightGCN"


def readme_example() -> str:
    """The first python code block of the guide's section titled SECTION_TITLE."""
    section = GUIDE.read_text().split(SECTION_TITLE + "\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.xfail(raises=BelowBPR, strict=True, reason="the example (the paper's PNN on LightGCN) reaches 0.76 x "
                   "BPR here (NDCG@20 0.176 against 0.232): see docs/why-pnn.md")
def test_readme_lightgcn_example_trains_beats_most_popular_and_nearly_bpr(tmp_path):
    data = load_dataset(data_path("ml-100k"), split="rs", seed=2020)
    torch.manual_seed(0)
    batch_losses = []

    def record_pnn_loss(module, inputs, loss):
        if isinstance(module, PNNLoss):
            batch_losses.append(loss.item())

    hook = torch.nn.modules.module.register_module_forward_hook(record_pnn_loss)
    try:
        namespace = {"data": data}
        exec(compile(readme_example(), str(GUIDE), "exec"), namespace)
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
    # BPR on pnn_fast's LightGCN (the same graph model, 2 layers) with the example's optimiser and epochs
    bpr = TrainConfig(model="lightgcn", loss="bpr", epochs=4, batch_size=2048, lr=1e-2, reg_weight=0.0, dim=64)
    assert_reaches_bpr(ndcg, run(data, bpr, tmp_path, progress=False, log=lambda *_: None)["test"]["ndcg@20"])
