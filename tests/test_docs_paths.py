"""Every repository path the manual writes in backquotes exists, spelled one way.

The product's folders sit at the top of the repository and install inside ``eospack``
(``connectors/`` as ``eospack.connectors``), so a file has one path, its repository path:
``connectors/jdbc/binary_copy.py``. A page that spells it ``eospack/connectors/...`` sends a
reader to a folder that is not in the tree, and a path left behind by a move sends them
nowhere; module names in imports (``eospack.connectors.jdbc``) are not paths and are not
checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("connectors/*/README.md"),
    }
)
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# A repository path: words joined by slashes, ending in a file with an extension or in "/".
PATH = re.compile(r"^(?:[\w.-]+/)+(?:[\w.-]+\.[A-Za-z0-9]+|)$")
WRONG_SPELLINGS = ("eospack/connectors/", "eospack/commit_protocols/", "eospack/stateful_ops/")
# What a build or a run makes, not the repository: named by the pages, absent from a clone.
GENERATED = ("build/", "dist/", ".venv/", "eospack/_native.", "site/")
# Paths of other trees share the form (`pyspark/worker.py`, a checkpoint's `offsets/`, an
# option such as `key/value.deserializer`): a path counts as the repository's when its
# first folder is one of the repository's own top-level entries.
TOP_LEVEL = {entry.name for entry in ROOT.iterdir() if not entry.name.startswith(".git")}


def code_paths(text: str) -> list[str]:
    """The backquoted spans of ``text`` that are repository paths (no URL, glob, placeholder
    or absolute path; fenced code blocks are left out: they hold commands and output)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return [
        span
        for span in CODE_SPAN.findall(text)
        if PATH.match(span) and span.split("/", 1)[0] in TOP_LEVEL | {"eospack"}
    ]


def repository_paths() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for path in code_paths(page.read_text(encoding="utf-8")):
            found.append((str(page.relative_to(ROOT)), path))
    return found


def test_pages_name_paths_at_all() -> None:
    """The scan finds what it should, so an empty result cannot pass silently."""
    paths = {path for _, path in repository_paths()}
    assert "commit_protocols/coordinator.py" in paths
    assert code_paths("see `connectors/jdbc/binary_copy.py` and `eospack.connectors.jdbc`") == [
        "connectors/jdbc/binary_copy.py"
    ]


@pytest.mark.parametrize("wrong", WRONG_SPELLINGS)
def test_no_page_spells_a_product_folder_under_eospack(wrong: str) -> None:
    offenders = [f"{page}: `{path}`" for page, path in repository_paths() if path.startswith(wrong)]
    assert not offenders, f"name the repository path ({wrong[len('eospack/') :]}...): {offenders}"


def test_every_path_exists() -> None:
    missing = sorted(
        {
            f"{page}: `{path}`"
            for page, path in repository_paths()
            if not path.startswith(GENERATED) and not (ROOT / path).exists()
        }
    )
    assert not missing, "paths not in the repository:\n" + "\n".join(missing)
