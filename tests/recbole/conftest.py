"""tests/recbole runs only where RecBole 1.2.1 imports, i.e. in its own venv (RecBole needs numpy < 2,
the project's venv has numpy 2)::

    RECBOLE_VENV=../recbole-tests-venv bash bench/_recbole_setup.sh
    ../recbole-tests-venv/bin/python -m pip install --quiet --no-deps "scipy<1.13"  # RecBole's LightGCN needs it
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD ../recbole-tests-venv/bin/python -m pytest tests/recbole -p no:cacheprovider

(the last step of .ci/run). Anywhere else, e.g. the main suite's ``pytest``, the folder is not
collected, and the end of the run says why.
"""
import importlib.util
import sys
from pathlib import Path

try:
    import recbole.config  # noqa: F401  (also fails under numpy 2)
    NOT_COLLECTED = None
except Exception as exc:  # ImportError where absent, AttributeError from numpy 2, ...
    why = "not installed" if getattr(sys.modules.get("recbole"), "__file__", None) is None else f"{type(exc).__name__}: {exc}"
    NOT_COLLECTED = (f"tests/recbole not collected: RecBole 1.2.1 does not import in this Python ({why}); "
                     "its own venv: see tests/recbole/conftest.py")
    # With tests/ on sys.path (pytest's pythonpath), a failed "import recbole" leaves this very folder in
    # sys.modules as an empty namespace package "recbole": take it out again.
    for _name in [m for m in sys.modules if m == "recbole" or m.startswith("recbole.")]:
        del sys.modules[_name]

collect_ignore_glob = ["test_*.py"] if NOT_COLLECTED else []


def pytest_terminal_summary(terminalreporter):
    if NOT_COLLECTED:
        terminalreporter.write_line(NOT_COLLECTED)


def pytest_configure(config):
    """pytest imports each conftest.py of a folder without __init__.py as the module "conftest", so this
    file displaces tests/conftest.py from sys.modules, while the tests beside that one import their helpers
    from it by that name ("from conftest import data_path"). Give the name back to (a copy of) that file.
    Runs right after this file is imported and registered (pytest_configure is replayed for late plugins)."""
    spec = importlib.util.spec_from_file_location("conftest", Path(__file__).resolve().parents[1] / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["conftest"] = module
