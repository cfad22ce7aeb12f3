"""The package version; pyproject.toml states it too, and tests/test_build.py checks that they agree."""
__version__ = "0.1.0"
