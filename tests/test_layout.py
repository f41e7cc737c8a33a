"""The test tree itself: pytest imports test modules by basename (rootdir mode, no
packages), so two test files with one name make the second fail to collect."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_module_has_its_own_basename() -> None:
    names = Counter(
        path.name
        for folder in ("tests", "integration_tests")
        for path in (ROOT / folder).rglob("test_*.py")
    )
    assert [name for name, count in names.items() if count > 1] == []


MAPPED_FOLDERS = ("connectors", "commit_protocols", "stateful_ops")


def test_the_repository_holds_no_links() -> None:
    """One address per file: every tool that reads the committed tree sees the files
    Python imports (``git ls-files -s`` marks a link with mode 120000)."""
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t", 1)[1] for line in listed.splitlines() if line.startswith("120000")]
    assert links == []


def pyproject_setuptools() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_installs_every_package_folder_under_eospack() -> None:
    """The top-level folders install inside ``eospack`` (package-dir) and every folder with
    an ``__init__.py`` is a listed package: a folder left out would be missing from the
    wheel while the checkout, which serves the folders directly, still imports it."""
    setuptools = pyproject_setuptools()
    assert setuptools["package-dir"] == {
        "eospack": "eospack",
        **{f"eospack.{folder}": folder for folder in MAPPED_FOLDERS},
    }
    found = {
        ".".join(("eospack", *init.parent.relative_to(ROOT / top).parts))
        if top == "eospack"
        else ".".join(("eospack", *init.parent.relative_to(ROOT).parts))
        for top in ("eospack", *MAPPED_FOLDERS)
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert sorted(setuptools["packages"]) == sorted(found)


def test_checkout_layout_serves_the_same_mapping_as_pyproject() -> None:
    from eospack.core.checkout_layout import MAPPED_FOLDERS as SERVED

    assert SERVED == MAPPED_FOLDERS


def test_the_mapped_folders_are_imported_only_under_eospack() -> None:
    """``connectors/`` (and the others) are ``eospack.connectors`` (and so on): the checkout
    is also on ``sys.path``, and importing a module under a bare top-level name would make
    a second copy of it (two ledger caches, error classes that do not match)."""
    bare = re.compile(rf"^\s*(from|import) ({'|'.join(MAPPED_FOLDERS)})\b", re.MULTILINE)
    sources = [*ROOT.glob("*.py")]
    for folder in (*MAPPED_FOLDERS, "eospack", "tests", "integration_tests", "benchmarks"):
        sources += (ROOT / folder).rglob("*.py")
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
    """A source and a sink of one system live in one package (``connectors/kafka`` holds
    replayable-kafka and 2pc-kafka). Kafka's is split into rooms: ``records/`` (the record
    schema and codec), ``client/`` (kafka-python, its private parts included), ``source/``,
    ``sink/``, and one ``errors.py`` for every Kafka error class."""
    packages = sorted(path.parent.name for path in (ROOT / "connectors").glob("*/__init__.py"))
    assert packages == ["jdbc", "kafka", "s3"]
    kafka = ROOT / "connectors" / "kafka"
    rooms = sorted(path.parent.name for path in kafka.glob("*/__init__.py"))
    assert rooms == ["client", "records", "sink", "source"]
    flat = sorted(path.name for path in kafka.glob("*.py"))
    assert flat == ["__init__.py", "errors.py"]
    for module in (
        "source/data_source.py",
        "sink/data_source.py",
        "client/config.py",
        "records/schema.py",
    ):
        assert (kafka / module).is_file(), module
    defined_elsewhere = {
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in sorted(kafka.rglob("*.py"))
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Refusal", "Refused"))
    }
    assert sorted(defined_elsewhere) == []


def test_the_kafka_source_and_sink_do_not_import_each_other() -> None:
    """replayable-kafka and 2pc-kafka share only ``records/``, ``client/`` and
    ``errors.py``: a change to one side cannot break the other through an import (any
    import counts, a function-local or relative one too)."""
    graph = import_graph()
    kafka = ROOT / "connectors" / "kafka"
    offenders = {
        f"{found.importer.relative_to(ROOT)}:{found.line}: {found.module}"
        for found in graph.imports(ROOT)
        for side, other in (("source", "sink"), ("sink", "source"))
        if found.importer.is_relative_to(kafka / side)
        and found.imported.is_relative_to(kafka / other)
    }
    assert sorted(offenders) == []


def import_graph() -> ModuleType:
    """scripts/import_graph.py, the one definition of the floors (CONTRIBUTING's drawing)."""
    spec = importlib.util.spec_from_file_location(
        "import_graph", ROOT / "scripts" / "import_graph.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


def test_every_product_file_stands_on_a_floor() -> None:
    """core, protocols and operators, connectors, the operator's tools, the lab, the
    command line and face: a new file has to say which it is."""
    assert import_graph().unplaced(ROOT) == []


def test_no_import_runs_back_up_a_floor() -> None:
    """A floor imports its own and the ones below it (function-local imports count):
    the core knows no connector, a connector no tool, a tool no lab."""
    assert import_graph().imports_back_up(ROOT) == []


def test_no_files_import_each_other_in_a_loop() -> None:
    """No circle of imports that run (a TYPE_CHECKING import never runs and is left out)."""
    assert import_graph().circles(ROOT) == []
