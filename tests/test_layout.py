"""The test tree itself: pytest imports test modules by basename (rootdir mode, no
packages), so two test files with one name make the second fail to collect."""

from __future__ import annotations

import ast
import re
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


LINKED_FOLDERS = ("connectors", "commit_protocols", "stateful_ops")


def test_the_linked_folders_are_imported_only_under_eospack() -> None:
    """``eospack/connectors`` (and the others) link to the top-level folders, which a
    development install also puts on ``sys.path``: importing one module under both names
    would make two copies of it (two ledger caches, error classes that do not match)."""
    for folder in LINKED_FOLDERS:
        link = ROOT / "eospack" / folder
        assert link.is_symlink() and link.resolve() == ROOT / folder, link
    bare = re.compile(rf"^\s*(from|import) ({'|'.join(LINKED_FOLDERS)})\b", re.MULTILINE)
    sources = [*ROOT.glob("*.py")]
    for folder in (*LINKED_FOLDERS, "eospack", "tests", "integration_tests", "benchmarks"):
        sources += (ROOT / folder).rglob("*.py")  # rglob does not follow the links
    offenders = [str(path) for path in sources if bare.search(path.read_text())]
    assert offenders == []


def imported_modules(path: Path) -> list[str]:
    """Every module a file imports, at any depth (a function-local import counts too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def test_no_test_module_imports_another_test_module() -> None:
    """Shared helpers live in helper modules (no ``test_`` prefix): importing a test
    module runs its module-level code and fixtures a second time and ties one suite's
    layout to another's."""
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for folder in ("tests", "integration_tests")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in imported_modules(path)
        if any(part.startswith("test_") for part in name.split("."))
    }
    assert sorted(offenders) == []


def test_each_external_system_has_one_connector_package() -> None:
    """A source and a sink of one system live side by side with their shared client
    configuration and errors (``connectors/kafka`` holds replayable-kafka and 2pc-kafka)."""
    packages = sorted(path.parent.name for path in (ROOT / "connectors").glob("*/__init__.py"))
    assert packages == ["jdbc", "kafka", "s3"]
    kafka = ROOT / "connectors" / "kafka"
    for module in ("source.py", "sink.py", "client_config.py", "errors.py"):
        assert (kafka / module).is_file(), module
