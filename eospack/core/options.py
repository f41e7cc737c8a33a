"""``OptionReader``: the one reader of the string options Spark hands a Python data source.

Every connector parses its options through it, so each kind of value has one grammar and
every refusal has one shape, raised before any data moves in the connector's own error
class: ``Option <name> is '<value>': use <what to do>`` (one line; a secret's value is never
shown: ``Option <name> is not valid: use ...``), and ``Option <name> is required: set <name>
to ...`` for a missing one.

Option names are case-insensitive, as Spark makes them: the options are wrapped once in
pyspark's own ``CaseInsensitiveDict``, so a plain dict (unit tests, tools) reads like Spark's
map and no connector lower-cases keys itself. Values are stripped, and an empty value counts
as unset (the default applies), except through ``with_prefix``, which passes values through
as given (``kafka.ssl.endpoint.identification.algorithm=""`` means something).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import overload

from pyspark.sql.datasource import CaseInsensitiveDict

DURATION_EXAMPLES = "500ms, 30s, 2min or 1h"
# A bare number is milliseconds. Units in microseconds, so results are exact integers.
_DURATION_UNITS_US = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}
_DURATION = re.compile(r"(\d+)\s*([a-z]*)")
# Spark-style byte sizes, powers of 1024: 134217728, 512k, 128m, 128mb, 1g, 1gib, 1t.
_BYTE_SIZE = re.compile(r"(\d+)\s*([kmgt]?)i?b?")
_BYTE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def option_error(
    error_class: type[Exception], name: str, value: object, fix: str, *, secret: bool = False
) -> Exception:
    """The one-line refusal of ``value`` for option ``name``; ``fix`` follows ``use``.

    For code that checks options outside a reader (``kafka.*`` values mapped onto
    kafka-python), so that its messages have the reader's shape. ``repr`` keeps the message
    on one line whatever the value holds; a secret's value is left out entirely.
    """
    if secret:
        return error_class(f"Option {name} is not valid: use {fix}")
    return error_class(f"Option {name} is {value!r}: use {fix}")


class OptionReader:
    """Typed, validated values of one option map; every refusal raises ``error_class``.

    Create one per parse. Each method returns the option's value as its type, or the
    default when the option is unset or blank, and refuses anything else with one line
    naming the option and the fix.
    """

    def __init__(self, options: Mapping[str, object], error_class: type[Exception]) -> None:
        self._options = CaseInsensitiveDict(
            {str(key): str(value) for key, value in options.items() if value is not None}
        )
        self.error_class = error_class
        self._secret_names: set[str] = set()

    @overload
    def text(self, name: str) -> str | None: ...

    @overload
    def text(self, name: str, default: str) -> str: ...

    def text(self, name: str, default: str | None = None) -> str | None:
        """The stripped value; ``default`` when unset or blank."""
        value = self._options.get(name)
        if value is None or not value.strip():
            return default
        return value.strip()

    @overload
    def identity(self, name: str, fix: str) -> str | None: ...

    @overload
    def identity(self, name: str, fix: str, default: str) -> str: ...

    def identity(self, name: str, fix: str, default: str | None = None) -> str | None:
        """Like ``text``, for an option that names a sink's identity (its id, where its
        decisions live): unset means ``default``, but a blank value is refused, since a
        typo'd empty value silently meaning "derived" or "the default" would move the sink
        to another identity across a restart. ``fix`` follows ``leave it unset or use``."""
        value = self._options.get(name)
        if value is not None and not value.strip():
            raise self.error_class(f"Option {name} is blank: leave it unset or use {fix}")
        return self.text(name, default) if default is not None else self.text(name)

    def required(self, name: str, fix: str) -> str:
        """The stripped value; refused when unset or blank (``fix`` follows ``set <name> to``)."""
        value = self.text(name)
        if value is None:
            raise self.error_class(f"Option {name} is required: set {name} to {fix}")
        return value

    def secret(self, name: str) -> str | None:
        """The stripped value (None when unset); no error about this option shows it."""
        self._secret_names.add(name.lower())
        return self.text(name)

    def refuse(self, name: str, fix: str, value: str | None = None) -> Exception:
        """The error refusing option ``name`` (its value, or ``value`` if given), for a
        connector's own checks; raise it. Secrets are named but not shown."""
        shown = self.text(name) if value is None else value
        secret = name.lower() in self._secret_names
        return option_error(self.error_class, name, shown, fix, secret=secret)

    def boolean(self, name: str, default: bool) -> bool:
        """``true`` or ``false``, in any case."""
        value = self.text(name)
        if value is None:
            return default
        if value.lower() not in ("true", "false"):
            raise self.refuse(name, "true or false")
        return value.lower() == "true"

    @overload
    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str: ...

    @overload
    def choice(self, name: str, choices: tuple[str, ...], default: None) -> str | None: ...

    def choice(self, name: str, choices: tuple[str, ...], default: str | None) -> str | None:
        """One of ``choices`` (lower-case), given in any case; returned as in ``choices``."""
        value = self.text(name)
        if value is None:
            return default
        if value.lower() not in choices:
            marked = [f"{choice} (default)" if choice == default else choice for choice in choices]
            raise self.refuse(name, _alternatives(marked))
        return value.lower()

    @overload
    def positive_int(self, name: str, default: int) -> int: ...

    @overload
    def positive_int(self, name: str, default: None) -> int | None: ...

    def positive_int(self, name: str, default: int | None) -> int | None:
        """An integer above zero, as Python's ``int`` reads it."""
        value = self.text(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number <= 0:
            raise self.refuse(name, "a positive integer")
        return number

    def duration_ms(self, name: str, default: int, *, positive: bool = False) -> int:
        """Milliseconds of a duration such as ``500ms``, ``30s``, ``2min``/``2m``, ``1h``.

        A bare number is milliseconds; ``us`` and ``d`` are accepted too (microseconds are
        rounded down to whole milliseconds). Units are case-insensitive and may follow a
        space. With ``positive``, a duration of less than 1 ms is refused.
        """
        value = self.text(name)
        if value is None:
            return default
        match = _DURATION.fullmatch(value.lower())
        if match is None or (match.group(2) or "ms") not in _DURATION_UNITS_US:
            raise self.refuse(name, f"a duration such as {DURATION_EXAMPLES}")
        milliseconds = int(match.group(1)) * _DURATION_UNITS_US[match.group(2) or "ms"] // 1000
        if positive and milliseconds <= 0:
            raise self.refuse(name, f"a positive duration such as {DURATION_EXAMPLES}")
        return milliseconds

    def byte_size(self, name: str, default: int) -> int:
        """Bytes of a size such as ``134217728``, ``512k``, ``128m``, ``128mb``, ``1g``,
        ``1gib`` or ``1t`` (powers of 1024, case-insensitive)."""
        value = self.text(name)
        if value is None:
            return default
        match = _BYTE_SIZE.fullmatch(value.lower())
        if match is None:
            raise self.refuse(name, "a size in bytes or with k, m, g or t, such as 128m")
        return int(match.group(1)) * _BYTE_UNITS[match.group(2)]

    def with_prefix(self, prefix: str) -> list[tuple[str, str]]:
        """(name without ``prefix``, value as given) of every option starting with
        ``prefix``, sorted by name; names come lower-cased, as Spark hands them over."""
        lowered = prefix.lower()
        return sorted(
            (key[len(lowered) :], value)
            for key, value in self._options.items()
            if key.startswith(lowered)
        )


def _alternatives(choices: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    if len(choices) <= 1:
        return "".join(choices)
    return f"{', '.join(choices[:-1])} or {choices[-1]}"
