"""One column per type the 2pc-jdbc sink maps, with values that test its edges, and the rows
they should read back as."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

UTC = datetime.timezone.utc


def _instant(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


INSTANTS = [
    _instant(1, 1, 1, 0, 0, 0, 1),
    _instant(1900, 1, 1, 0, 0, 0, 1),
    _instant(1969, 12, 31, 23, 59, 59, 999999),
    _instant(1970, 1, 1),
    _instant(1999, 12, 31, 23, 59, 59, 999999),
    _instant(2000, 1, 1),
    _instant(9999, 12, 31, 23, 59, 59, 999999),
    None,
]


TEXTS = [
    "quote \"x\" 'y'",
    "a,b,,c",
    "back\\slash \\N \\x00 \\.",
    "new\nline\r\ncrlf",
    "tab\there",
    "ünïcødé 漢字 😀",
    "",
    None,
]


COLUMNS: list[tuple[str, str, pa.DataType, list[Any]]] = [
    ("id", "BIGINT", pa.int64(), list(range(8))),
    ("big", "BIGINT", pa.int64(), [-(2**63), 2**63 - 1, 0, -1, 42, 1, 2, None]),
    ("whole", "INT", pa.int32(), [-(2**31), 2**31 - 1, 0, -1, 7, 1, 2, None]),
    ("small", "SMALLINT", pa.int16(), [-32768, 32767, 0, -1, 5, 1, 2, None]),
    ("tiny", "TINYINT", pa.int8(), [-128, 127, 0, -1, 3, 1, 2, None]),
    (
        "single",
        "FLOAT",
        pa.float32(),
        [0.1, -3.4028234663852886e38, 1.401298464324817e-45, -0.0, math.inf, -math.inf, 1.5, None],
    ),
    (
        "double",
        "DOUBLE",
        pa.float64(),
        [0.1, 1.7976931348623157e308, 5e-324, -0.0, math.inf, -math.inf, 1 / 3, None],
    ),
    ("flag", "BOOLEAN", pa.bool_(), [True, False, True, False, True, False, True, None]),
    (
        "wide",
        "DECIMAL(38,10)",
        pa.decimal128(38, 10),
        [
            Decimal("-1234567890123456789012345678.0123456789"),
            Decimal("9999999999999999999999999999.9999999999"),
            Decimal("0.0000000001"),
            Decimal("0E-10"),
            Decimal("-0.5000000000"),
            Decimal("-9999999999999999999999999999.9999999999"),
            Decimal("100.0000000000"),
            None,
        ],
    ),
    (
        "whole_decimal",
        "DECIMAL(18,0)",
        pa.decimal128(18, 0),
        [
            Decimal(-(10**18 - 1)),
            Decimal(10**18 - 1),
            Decimal(0),
            Decimal(-1),
            Decimal(10000),
            Decimal(10**17),
            Decimal(2),
            None,
        ],
    ),
    (
        "money",
        "DECIMAL(9,3)",
        pa.decimal128(9, 3),
        [
            Decimal("-123456.789"),
            Decimal("0.001"),
            Decimal("-0.001"),
            Decimal("1000.000"),
            Decimal("0.100"),
            Decimal("999999.999"),
            Decimal("0.000"),
            None,
        ],
    ),
    ("label", "STRING", pa.string(), TEXTS),
    (
        "payload",
        "BINARY",
        pa.binary(),
        [b"", bytes(range(256)), b"\x00", b"\\x00", b"plain", b'\n\r,"', b"\xff\xfe", None],
    ),
    (
        "day",
        "DATE",
        pa.date32(),
        [
            datetime.date(1, 1, 1),
            datetime.date(1969, 12, 31),
            datetime.date(1970, 1, 1),
            datetime.date(9999, 12, 31),
            datetime.date(2000, 1, 1),
            datetime.date(1999, 12, 31),
            datetime.date(2024, 2, 29),
            None,
        ],
    ),
    ("at", "TIMESTAMP", pa.timestamp("us", tz="UTC"), INSTANTS),
    (
        "local",
        "TIMESTAMP_NTZ",
        pa.timestamp("us"),
        [None if at is None else at.replace(tzinfo=None) for at in INSTANTS],
    ),
]


NAMES = [name for name, _, _, _ in COLUMNS]


def expected_rows() -> list[tuple[Any, ...]]:
    """The input rows as the database should return them: a float column (``real``) comes
    back as the float32 value widened to double (read as ``single::float8``)."""
    columns = []
    for name, _, _, values in COLUMNS:
        if name == "single":
            values = [None if v is None else float(np.float32(v)) for v in values]
        columns.append(values)
    return list(zip(*columns, strict=True))


def comparable(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """NaN never equals itself and -0.0 equals 0.0: compare floats by their repr."""
    return [
        tuple(repr(value) if isinstance(value, float) else value for value in row) for row in rows
    ]
