"""Every error class eospack defines derives from ``EospackError`` (and keeps its built-in
base), so ``except EospackError`` catches whatever eospack raises on purpose."""

from __future__ import annotations

import importlib
import inspect

import pytest

from eospack.core.checkout_layout import every_module_name
from eospack.core.errors import EospackError


def error_classes() -> list[type[BaseException]]:
    found = []
    for name in every_module_name():
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
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
