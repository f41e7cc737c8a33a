"""The house as Python imports it: the product's floors and the imports between them.

``python scripts/import_graph.py`` prints a Mermaid graph (CONTRIBUTING.md shows it) of the
floors below, with the number of imports from each to each, read from the committed files:
an import of ``eospack.connectors.kafka.x`` is resolved through pyproject.toml's
``package-dir`` to ``connectors/kafka/x.py``, as Python resolves it. ``--check`` prints
each import that runs back up a floor and exits 1 when there is one (tests/test_layout.py
runs the same check). Function-local imports count; imports under ``TYPE_CHECKING`` do not
(they never run).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent

FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("eospack/core/",)),
    ("protocols and operators", ("commit_protocols/", "stateful_ops/")),
    ("connectors", ("connectors/",)),
    ("operator's tools", ("eospack/tools/",)),
    ("lab", ("eospack/lab/",)),
    (
        "command line and face",
        (
            "eospack/cli.py",
            "eospack/__init__.py",
            "eospack/metrics.py",
            "eospack/python_daemon.py",
            "pyspark_",
        ),
    ),
)
"""Bottom up: a file may import its own floor and the floors below it, never one above."""


@dataclass(frozen=True)
class Import:
    importer: Path
    line: int
    module: str
    imported: Path


def package_folders(root: Path) -> dict[str, Path]:
    """Package name -> folder, from pyproject.toml's package-dir."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: root / folder for name, folder in setuptools["package-dir"].items()}


def product_files(root: Path) -> list[Path]:
    folders = sorted(set(package_folders(root).values()))
    files = [path for folder in folders for path in folder.rglob("*.py")]
    files += sorted(root.glob("pyspark_*.py"))
    return sorted(path for path in files if "__pycache__" not in path.parts)


def module_file(root: Path, module: str) -> Path | None:
    """The file ``module`` is read from: the longest package-dir prefix, then its folders."""
    folders = package_folders(root)
    for name in sorted(folders, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            base = folders[name].joinpath(*module[len(name) :].strip(".").split("."))
            for candidate in (base / "__init__.py", base.with_suffix(".py")):
                if candidate.is_file():
                    return candidate
            return None
    return None


def module_name(root: Path, path: Path) -> str:
    """The name Python imports ``path`` under (package-dir read backwards)."""
    for name, folder in sorted(package_folders(root).items(), key=lambda item: -len(item[0])):
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            return ".".join((name, *parts)).removesuffix(".__init__")
    return path.relative_to(root).with_suffix("").as_posix().replace("/", ".")


def absolute_module(root: Path, path: Path, node: ast.ImportFrom) -> str | None:
    """The module ``from ... import`` names, relative imports resolved as Python does."""
    if node.level == 0:
        return node.module
    package = module_name(root, path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def checked_only(tree: ast.Module) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for inner in ast.walk(child):
                    if hasattr(inner, "lineno"):
                        lines.add(inner.lineno)
    return lines


def imports(root: Path) -> list[Import]:
    found: list[Import] = []
    for path in product_files(root):
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = checked_only(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skipped:
                continue
            candidates: list[list[str]] = []
            if isinstance(node, ast.Import):
                candidates = [[alias.name] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = absolute_module(root, path, node)
                if module:
                    candidates = [[f"{module}.{alias.name}", module] for alias in node.names]
            targets: dict[Path, str] = {}
            for names in candidates:
                for name in names:
                    target = module_file(root, name)
                    if target is not None:
                        targets.setdefault(target, name)
                        break
            for target, name in targets.items():
                if target != path:
                    found.append(Import(path, node.lineno, name, target))
    return found


def floor_of(root: Path, path: Path) -> int | None:
    relative = path.relative_to(root).as_posix()
    for number, (_, prefixes) in enumerate(FLOORS):
        if any(relative.startswith(prefix) for prefix in prefixes):
            return number
    return None


def imports_back_up(root: Path) -> list[str]:
    """Each import from a lower floor to a higher one, as ``file:line: module (floor)``."""
    offenders = []
    for found in imports(root):
        low, high = floor_of(root, found.importer), floor_of(root, found.imported)
        if low is not None and high is not None and high > low:
            offenders.append(
                f"{found.importer.relative_to(root)}:{found.line}: imports {found.module}"
                f" ({FLOORS[low][0]} -> {FLOORS[high][0]})"
            )
    return offenders


def unplaced(root: Path) -> list[str]:
    return [
        str(path.relative_to(root)) for path in product_files(root) if floor_of(root, path) is None
    ]


def circles(root: Path) -> list[list[str]]:
    """Files that import each other in a loop (imports that run, TYPE_CHECKING ones left
    out), each circle sorted: Tarjan's strongly connected components of the file graph."""
    edges: dict[Path, set[Path]] = {}
    for found in imports(root):
        edges.setdefault(found.importer, set()).add(found.imported)
    order: dict[Path, int] = {}
    lowest: dict[Path, int] = {}
    stack: list[Path] = []
    found_circles: list[list[str]] = []

    def visit(file: Path) -> None:
        order[file] = lowest[file] = len(order)
        stack.append(file)
        for imported in edges.get(file, ()):
            if imported not in order:
                visit(imported)
                lowest[file] = min(lowest[file], lowest[imported])
            elif imported in stack:
                lowest[file] = min(lowest[file], order[imported])
        if lowest[file] == order[file]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == file:
                    break
            if len(members) > 1:
                found_circles.append(sorted(str(path.relative_to(root)) for path in members))

    for file in sorted(edges):
        if file not in order:
            visit(file)
    return sorted(found_circles)


def mermaid(root: Path) -> str:
    """The floors as boxes (top down) and the imports between them as counted arrows."""
    counts: Counter[tuple[int, int]] = Counter()
    for found in imports(root):
        low, high = floor_of(root, found.importer), floor_of(root, found.imported)
        if low is not None and high is not None and low != high:
            counts[(low, high)] += 1
    lines = ["flowchart TB"]
    for number, (name, prefixes) in reversed(list(enumerate(FLOORS))):
        label = f"{number + 1}. {name}<br/>{' '.join(prefixes)}"
        lines.append(f'    floor{number}["{label}"]')
    for (low, high), count in sorted(counts.items(), key=lambda item: (-item[0][0], item[0][1])):
        lines.append(f"    floor{low} -->|{count}| floor{high}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="list imports back up a floor and circles"
    )
    arguments = parser.parse_args()
    if arguments.check:
        problems = [f"not on a floor: {path}" for path in unplaced(ROOT)]
        problems += imports_back_up(ROOT)
        problems += [f"circle: {' -> '.join(circle)}" for circle in circles(ROOT)]
        print("\n".join(problems) or "no import runs back up a floor, no circle")
        return 1 if problems else 0
    print(mermaid(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
