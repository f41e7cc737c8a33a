"""Shared by the ``writeMode=changes`` tests and their drivers: change logs of a simulated
source table, the table they end in, parquet files of them, and Debezium envelopes.

A change log is made as a source database makes one: each change of a key gets the next
version (an LSN), inserts of absent keys, updates and deletes of present ones. Delivery is
then disturbed as a change stream may be (changes replayed in later batches, changes
moved to a later batch than newer ones of the same key), which must not change where the
target ends: per key the change with the highest version decides.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

CHANGE_SCHEMA_DDL = "id BIGINT, name STRING, version BIGINT, op STRING"
CHANGE_ARROW_SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("version", pa.int64()), ("op", pa.string())]
)


@dataclass(frozen=True)
class Change:
    id: int
    name: str | None
    version: int
    op: str

    def row(self) -> tuple[int, str | None, int, str]:
        return (self.id, self.name, self.version, self.op)


def change_log(seed: int, count: int, keys: int, first_version: int = 1) -> list[Change]:
    """``count`` changes of a source table with ids below ``keys``, versions increasing."""
    rng = random.Random(seed)
    present: dict[int, str] = {}
    log: list[Change] = []
    for index in range(count):
        key = rng.randrange(keys)
        version = first_version + index
        if key not in present:
            op = "r" if rng.random() < 0.2 else "c"
            present[key] = f"n{key}-{version}"
            log.append(Change(key, present[key], version, op))
        elif rng.random() < 0.3:
            log.append(Change(key, present.pop(key), version, "d"))
        else:
            present[key] = f"n{key}-{version}"
            log.append(Change(key, present[key], version, "u"))
    return log


def disturbed_batches(seed: int, log: list[Change], batches: int) -> list[list[Change]]:
    """The log cut into ``batches`` batches, then: about 10% of the changes also replayed in
    a later batch, and about 10% moved to the next batch (arriving after newer changes of
    their key). Each batch is shuffled: order within a batch carries no meaning."""
    rng = random.Random(seed + 1)
    size = -(-len(log) // batches)
    cut = [list(log[i : i + size]) for i in range(0, len(log), size)]
    for index in range(len(cut) - 1):
        for change in list(cut[index]):
            roll = rng.random()
            if roll < 0.1:
                cut[rng.randrange(index + 1, len(cut))].append(change)
            elif roll < 0.2:
                cut[index].remove(change)
                cut[index + 1].append(change)
    for batch in cut:
        rng.shuffle(batch)
    return cut


def expected_table(changes: list[Change]) -> list[tuple[int, str | None, int]]:
    """Where the target must end: per key the change with the highest version; a key whose
    newest change is a delete has no row. (Versions are unique per key here.)"""
    newest: dict[int, Change] = {}
    for change in changes:
        if change.id not in newest or newest[change.id].version < change.version:
            newest[change.id] = change
    return sorted((c.id, c.name, c.version) for c in newest.values() if c.op not in ("d",))


def write_change_files(directory: Path, batches: list[list[Change]]) -> None:
    """One parquet file per micro-batch (read with maxFilesPerTrigger=1), in order."""
    directory.mkdir(parents=True, exist_ok=True)
    start = len(list(directory.glob("*.parquet")))
    for offset, batch in enumerate(batches):
        index = start + offset
        path = directory / f"part-{index:04d}.parquet"
        columns = [list(column) for column in zip(*(c.row() for c in batch), strict=True)]
        table = pa.table(columns or [[], [], [], []], schema=CHANGE_ARROW_SCHEMA)
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


# Debezium ------------------------------------------------------------------------------

DEBEZIUM_TABLES = ("customers", "orders", "items")
PASSWORD_VARIABLE = "EOSPACK_TEST_JDBC_PASSWORD"
"""The crash driver's database password, from the environment (never on a command line
that a failure prints)."""


def debezium_event(table: str, change: Change, lsn: int) -> bytes:
    """The value of a Debezium JSON change event (``value.converter.schemas.enable=false``):
    ``before``/``after`` row images, ``op``, and ``source`` with ``lsn`` and ``ts_ms``."""
    image = {"id": change.id, "name": change.name}
    envelope: dict[str, Any] = {
        "before": image if change.op in ("u", "d") else None,
        "after": None if change.op == "d" else image,
        "op": change.op,
        "ts_ms": 1_700_000_000_000 + lsn,
        "source": {
            "connector": "postgresql",
            "db": "shop",
            "schema": "public",
            "table": table,
            "lsn": lsn,
            "ts_ms": 1_700_000_000_000 + lsn,
        },
    }
    return json.dumps(envelope).encode()


def debezium_key(change: Change) -> bytes:
    return json.dumps({"id": change.id}).encode()
