"""Collect the ``bench_<op>.py`` files of this folder when pytest is given the folder itself.

pytest's default ``python_files`` is ``test_*.py``, which names a file only when it is on the command
line; the project's ini options cannot change for bench/ alone, so this hook adds the files here.
"""
import pytest


def pytest_collect_file(file_path, parent):
    named_on_command_line = parent.session.isinitpath(file_path)  # pytest collects those already
    if file_path.suffix == ".py" and file_path.name.startswith("bench_") and not named_on_command_line:
        return pytest.Module.from_parent(parent, path=file_path)
    return None
