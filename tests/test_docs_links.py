"""Every relative link and anchor in the README and docs/ resolves, and the README's results table
is the one the studies' summary.json files give (studies/readme_table.py), so neither can drift."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "DEVELOPERS.md", ROOT / "bench" / "README.md", ROOT / "bench" / "history.md",
             *sorted((ROOT / "studies").glob("*.md")), *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: Path) -> str:
    """The markdown of path without its fenced code blocks (whose brackets are code, not links)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)


def anchors(path: Path) -> set:
    """GitHub's anchors of path's headings: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+ (.*)$", prose(path), re.MULTILINE)}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_resolve(document):
    broken = []
    for target in LINK.findall(prose(document)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:: not checked here
            continue
        file, _, anchor = target.partition("#")
        path = (document.parent / file).resolve() if file else document
        if not path.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{document.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_anchor_rule_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# The guide: `sparse=True`, large catalogs\n\n```\n# not a heading\n```\n")
    assert anchors(page) == {"the-guide-sparsetrue-large-catalogs"}


def test_readme_table_is_the_studies():
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "studies" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.table()
    assert table.count("\n") == len(module.ROWS) + 3  # header, rule, the rows and the best
    assert table in (ROOT / "README.md").read_text(), "README.md's table differs from python studies/readme_table.py"
