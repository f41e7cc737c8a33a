"""``eospack.lab.testing.session_settings``: what a block sets is undone, also on failure."""

from __future__ import annotations

import pytest

from eospack.lab.testing import session_settings


class Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.values.get(name, default)

    def set(self, name: str, value: str) -> None:
        self.values[name] = value

    def unset(self, name: str) -> None:
        del self.values[name]


class Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = Conf(values)


def test_a_setting_that_was_there_comes_back_and_one_that_was_not_is_unset() -> None:
    spark = Session({"a": "1"})
    with session_settings(spark, {"a": "2", "b": "3"}):
        assert spark.conf.values == {"a": "2", "b": "3"}
    assert spark.conf.values == {"a": "1"}


def test_the_settings_are_undone_when_the_block_fails() -> None:
    spark = Session({})
    with pytest.raises(RuntimeError), session_settings(spark, {"a": "2"}):
        raise RuntimeError("query failed")
    assert spark.conf.values == {}
