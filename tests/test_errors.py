"""Every error class eospack defines derives from ``EospackError`` (and keeps its built-in
base), so ``except EospackError`` catches whatever eospack raises on purpose."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from eospack.errors import EospackError

PACKAGES = ("eospack",)


def error_classes() -> list[type[BaseException]]:
    found = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for module_info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if module_info.name.endswith("__main__"):
                continue
            module = importlib.import_module(module_info.name)
            found += [
                value
                for value in vars(module).values()
                if inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ]
    return found


def test_the_packages_define_errors_at_all() -> None:
    assert len(error_classes()) >= 30


@pytest.mark.parametrize("error", error_classes(), ids=lambda error: error.__qualname__)
def test_every_error_class_derives_from_eospack_error(error: type[BaseException]) -> None:
    assert issubclass(error, EospackError), f"{error.__module__}.{error.__qualname__}"
