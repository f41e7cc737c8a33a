"""eospack's public face: ``eospack.__all__`` names what users import, and stays cheap.

The rule for examples in the manual (README.md and docs/**/*.md, every fenced ``python``
block): ``from eospack import X`` only for X in ``eospack.__all__``; ``import eospack``
(then ``eospack.X`` with X in ``__all__``); ``from eospack.stateful_ops import X`` only
for X in that package's own ``__all__`` (documented as public in docs/stateful-operators.md
section); and ``import eospack.metrics`` or ``from eospack.metrics import X`` with X in its
``__all__`` (docs/metrics.md). Any other ``eospack.*`` module is internal and may change
without notice.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import eospack

ROOT = Path(__file__).resolve().parent.parent


def public_modules() -> dict[str, list[str]]:
    """Each module an example may import from, with the names it may import."""
    from eospack import metrics, stateful_ops

    return {
        "eospack": list(eospack.__all__),
        "eospack.stateful_ops": list(stateful_ops.__all__),
        "eospack.metrics": list(metrics.__all__),
    }


IMPORTABLE_MODULES = ("eospack", "eospack.metrics")
"""Modules an example may ``import`` whole."""


def manual_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def eospack_imports(block: str) -> list[tuple[str, str | None]]:
    """(module, name) for each import of eospack in ``block``; name None for ``import``.
    Blocks with ``...`` placeholders may not parse whole, so each import line is parsed."""
    found: list[tuple[str, str | None]] = []
    lines = block.splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith(("import eospack", "from eospack")):
            continue
        statement = stripped
        if "(" in statement and ")" not in statement:
            rest = lines[number + 1 :]
            statement += " " + " ".join(
                part.strip()
                for part in rest[
                    : next(index for index, part in enumerate(rest) if ")" in part) + 1
                ]
            )
        node = ast.parse(statement).body[0]
        if isinstance(node, ast.ImportFrom):
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
    return found


@pytest.mark.parametrize("name", eospack.__all__)
def test_every_public_name_resolves_to_the_object_of_its_home_module(name: str) -> None:
    value = getattr(eospack, name)
    home = eospack._HOMES.get(name)
    if home is not None:
        assert value is getattr(importlib.import_module(home), name)
    assert name in dir(eospack)


def test_public_names_are_unique_and_each_lazy_one_has_a_home() -> None:
    assert len(eospack.__all__) == len(set(eospack.__all__))
    assert set(eospack.__all__) == {"EospackError", "register", *eospack._HOMES}


def test_an_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'not_a_public_name'"):
        eospack.not_a_public_name  # noqa: B018


def test_the_errors_users_catch_are_eospack_errors() -> None:
    for name in eospack.__all__:
        value = getattr(eospack, name)
        if name.endswith("Error"):
            assert issubclass(value, eospack.EospackError), name


def test_import_eospack_loads_neither_pyspark_sql_pandas_nor_the_connectors() -> None:
    code = (
        "import sys, eospack\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('pandas', 'pyarrow')"
        " or m.startswith(('pyspark.sql', 'eospack.connectors', 'eospack.stateful_ops'))]\n"
        "print(heavy)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert completed.stdout.strip() == "[]"


def test_the_manual_s_examples_import_only_public_names() -> None:
    allowed = public_modules()
    checked = 0
    wrong = []
    for page in manual_pages():
        for block in python_blocks(page.read_text(encoding="utf-8")):
            for module, name in eospack_imports(block):
                checked += 1
                if name is None and module not in IMPORTABLE_MODULES:
                    wrong.append(f"{page.name}: import {module}")
                elif name is not None and name not in allowed.get(module, []):
                    wrong.append(f"{page.name}: from {module} import {name}")
    assert checked > 0
    assert wrong == []


def test_an_internal_import_in_an_example_is_found() -> None:
    block = (
        "from eospack.tools.supervisor import (\n    supervise,\n)\nimport eospack.tools.spark\n"
    )
    assert eospack_imports(block) == [
        ("eospack.tools.supervisor", "supervise"),
        ("eospack.tools.spark", None),
    ]
