"""The package is a straight stack: no module imports, directly or through others, one that
imports it back, and every module imports on its own in a fresh interpreter."""
import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pnn_fast"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
COMPILED = {"pnn_fast._C"}  # the extension: a leaf that imports nothing of the package


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(name: str, path: Path) -> set:
    """The package's modules that ``name`` imports at import time or in any function (ignoring
    ``if TYPE_CHECKING:`` blocks, which never run)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = {id(n) for block in ast.walk(tree) if is_type_checking_block(block) for n in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (node.module if not node.level else base)
            for alias in node.names:  # "from . import x" imports module x; "from .m import f" imports m
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in MODULES or submodule in COMPILED else target)
    return {m for m in found if m in MODULES and m != name}  # (the compiled leaf drops out here)


def find_cycle(graph: dict):
    """One cycle of ``graph`` (a list of modules, the first repeated at the end), or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, stack + [nxt])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [start])
            if cycle:
                return cycle
    return None


def test_no_import_cycle():
    graph = {name: imported_modules(name, path) for name, path in MODULES.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_inside_a_function_of_the_package():
    """Imports of the package's own modules sit at the top of each module, where the stack shows;
    only the loader of the compiled extension imports inside a function (it may be absent)."""
    lazy = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(func):
                    if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("pnn_fast")):
                        if not (name == "pnn_fast._extension" and [a.name for a in node.names] == ["_C"]):
                            lazy.append(f"{name}:{node.lineno}")
    assert lazy == []


#: integrations whose third-party package is optional: without it, importing them says what to install
OPTIONAL = {"pnn_fast.integrations.recbole": "recbole"}


def has_package(name: str) -> bool:
    """Whether ``name`` is an installed package: a bare folder of that name on sys.path (tests/recbole,
    with pytest's pythonpath = tests) is only a namespace package (origin None), not the package."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"pnn_fast.__main__"}))  # that one runs the CLI
def test_each_module_imports_alone(name):
    run = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    if name in OPTIONAL and not has_package(OPTIONAL[name]):
        assert run.returncode != 0 and f"pip install {OPTIONAL[name]}" in run.stderr.strip().splitlines()[-1]
        return
    assert run.returncode == 0, run.stderr.strip().splitlines()[-1:]
