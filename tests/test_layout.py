"""The test tree itself: pytest imports test modules by basename (rootdir mode, no
packages), so two test files with one name make the second fail to collect."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_module_has_its_own_basename() -> None:
    names = Counter(
        path.name
        for folder in ("tests", "integration_tests")
        for path in (ROOT / folder).rglob("test_*.py")
    )
    assert [name for name, count in names.items() if count > 1] == []
