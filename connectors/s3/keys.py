"""Object keys of 2pc-s3: where a data file lives under the prefix, and what its key says.

Layout: ``<prefix>/[col=value/...]<transaction id>.<file number>.<parquet|jsonl>``, with
Hive-style directories for ``partitionBy`` (values escaped as Spark escapes them, a null
or empty value as ``__HIVE_DEFAULT_PARTITION__``). The transaction id
(``eospack-<sink>-<batch>-<partition>-<attempt>``) in every key is how recovery tells this
sink's uploads from anyone else's under the same prefix, and how the reader gets the
partition values back: ``unescape_path_name`` undoes ``escape_path_name`` and
``partition_values_of_key`` reads back what ``partition_directory`` wrote. Keys under
``<prefix>/_eospack/`` are eospack's own (manifests), never data files.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from ...commit_protocols import parse_transaction_id
from .options import EOSPACK_DIRECTORY

HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# Spark's ExternalCatalogUtils.escapePathName set: these become %XX in directory names.
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(code) for code in range(1, 32))


def escape_path_name(value: str) -> str:
    return "".join(f"%{ord(char):02X}" if char in _ESCAPED else char for char in value)


def unescape_path_name(value: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(value):
        char = value[index]
        if char == "%" and _is_hex(value[index + 1 : index + 3]):
            out.append(chr(int(value[index + 1 : index + 3], 16)))
            index += 3
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(char in "0123456789abcdefABCDEF" for char in text)


def partition_directory(columns: Sequence[str], values: Sequence[Any]) -> str:
    """``a=1/b=x%2Fy/`` for Hive-style partitioning ("" without partition columns)."""
    return "".join(
        f"{escape_path_name(column)}={_partition_text(value)}/"
        for column, value in zip(columns, values, strict=True)
    )


def _partition_text(value: Any) -> str:
    if value is None or value == "":
        return HIVE_DEFAULT_PARTITION
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return escape_path_name(str(value))


def partition_values_of_key(relative_key: str) -> dict[str, str | None]:
    """The ``column=value`` directories of a key below the prefix, unescaped (None for null)."""
    values: dict[str, str | None] = {}
    for segment in relative_key.split("/")[:-1]:
        column, separator, text = segment.partition("=")
        if not separator:
            continue
        value = unescape_path_name(text)
        values[unescape_path_name(column)] = None if value == HIVE_DEFAULT_PARTITION else value
    return values


def object_key(prefix: str, directory: str, transaction: str, number: int, extension: str) -> str:
    return f"{prefix}/{directory}{transaction}.{number:05d}.{extension}"


def transaction_id_of_key(prefix: str, key: str) -> str | None:
    """The eospack transaction id a data file's key carries, or None for any other key."""
    if not key.startswith(f"{prefix}/") or key.startswith(f"{prefix}/{EOSPACK_DIRECTORY}/"):
        return None
    name = key.rsplit("/", 1)[-1]
    transaction = name.split(".", 1)[0]
    return transaction if parse_transaction_id(transaction) is not None else None
