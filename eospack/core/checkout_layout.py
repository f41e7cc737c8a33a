"""One name per module, whatever the install: ``eospack.connectors`` and its siblings.

The pack's machinery sits in three top-level folders of the repository (``connectors/``,
``commit_protocols/``, ``stateful_ops/``), the layout its users asked for, and installs as
subpackages of ``eospack`` (pyproject.toml's ``package-dir``): a wheel holds them inside
``eospack/`` and has no top-level ``connectors`` package. A source checkout is imported
another way: ``make install`` (an editable install in compat mode, so that Spark's lookup
of the ``pyspark_*`` modules sees the checkout), the tests, and Spark's Python workers
started in the checkout all find ``eospack`` in the checkout folder, where the three
folders sit beside it rather than inside it. :class:`CheckoutFolderFinder` serves them
there under the same names, the mapping pyproject.toml declares, so a module is never
imported under a second name (two copies would mean two ledger caches and error classes
that do not match).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from types import ModuleType

MAPPED_FOLDERS = ("connectors", "commit_protocols", "stateful_ops")
"""Top-level folders installed as ``eospack.<folder>`` (pyproject.toml's package-dir)."""


class CheckoutFolderFinder(MetaPathFinder):
    """Finds ``eospack.<folder>`` for each of :data:`MAPPED_FOLDERS` in a checkout's root;
    their submodules are then found by Python's own path finder inside the folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = {f"eospack.{folder}" for folder in MAPPED_FOLDERS}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        return PathFinder.find_spec(fullname, [str(self.root)])


def serve_checkout_folders(package_folder: Path) -> None:
    """Install the finder when ``eospack`` was imported from a checkout (the folders beside
    it, not inside it); an installed wheel needs none. Idempotent."""
    root = package_folder.parent
    if (package_folder / "connectors").is_dir():
        return
    if not all((root / folder / "__init__.py").is_file() for folder in MAPPED_FOLDERS):
        return
    if any(isinstance(finder, CheckoutFolderFinder) for finder in sys.meta_path):
        return
    sys.meta_path.append(CheckoutFolderFinder(root))


def write_installed_layout(checkout: Path, destination: Path) -> Path:
    """The installed layout of ``checkout`` as links under ``destination`` (``eospack/``
    with the three folders inside it), for tools that cannot read pyproject.toml's
    package-dir: the type checker reads this tree (``make lint``). Returns the package."""
    package = destination / "eospack"
    if destination.exists():
        for link in sorted(destination.rglob("*"), reverse=True):
            if link.is_symlink() or link.is_file():
                link.unlink()
            elif link.is_dir():
                link.rmdir()
    package.mkdir(parents=True)
    for entry in sorted((checkout / "eospack").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry.resolve())
    for folder in MAPPED_FOLDERS:
        (package / folder).symlink_to((checkout / folder).resolve())
    return package


def every_module_name() -> list[str]:
    """Every module of the package, found by walking ``eospack`` and each mapped folder
    (``pkgutil.walk_packages`` over ``eospack.__path__`` alone does not reach the mapped
    folders in a checkout, where they sit beside the package)."""
    import importlib
    import pkgutil

    names = {"eospack"}
    for package_name in ("eospack", *(f"eospack.{folder}" for folder in MAPPED_FOLDERS)):
        package = importlib.import_module(package_name)
        names.add(package_name)
        names.update(
            module.name for module in pkgutil.walk_packages(package.__path__, f"{package_name}.")
        )
    return sorted(names)
