"""The package version (pyproject.toml says the same; tests/test_public_api.py checks it)."""

__version__ = "0.1.0"
