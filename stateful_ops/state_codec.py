"""Encoding of one key group's state table into one GroupState row, and back.

A key group keeps the state of all its keys in a single state row
``(format_version int, operator string, table binary)``; ``table`` is an Arrow IPC stream
holding one row per key (key columns plus the operator's typed state fields), with the
operator's fixed settings (``key_groups``) and, for a named operator, its name
(``operator_name``, informational: never checked) in the schema metadata. Arrow keeps
every key type exact (nulls, composite keys, timestamps) and carries its own schema, so a
row written by an incompatible operator is detected here and reported with what changed.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from .errors import StateSchemaMismatchError
from .validation import OPERATOR_NAME_METADATA_KEY

STATE_FORMAT_VERSION = 1
GROUP_STATE_DDL = "format_version int, operator string, table binary"


EXPIRES_COLUMN = "__so_expires_at_ms"
"""With ``ttl``: the state field after the operator's own, when each key expires (the
processing time, in ms, of its last batch with rows plus the ttl)."""

TIMER_COLUMN = "__so_timer_at_ms"
"""With per-key timers (``StatefulOperator.timers``): the last state field (after
``EXPIRES_COLUMN`` with ttl), when the key's timer is due in ms (processing time, or event
time compared with the watermark); null: the key has no timer. A savepoint carries it like
every state column."""


SETTING_DEFAULTS = {b"ttl_time": b"processing", b"timers": b"processing"}
"""Checked settings a state's schema metadata holds only when not at their default (so that
states written before the setting existed keep their schema)."""

EXPIRY_CLOCK = b"expiry_clock"
"""deduplicate's checked setting: the clock of its expiries, ``event`` (``event_time`` set)
or ``processing``. Written by both kinds, so it has no default: a state written before it
existed lacks it, and is then unknown and not checked (neither kind is refused)."""

TTL_MS = b"ttl_ms"
"""With ``ttl``: the ttl (ms) a key group's rows were written with, informational (not
checked: ttl may change on a checkpoint). A changed ttl moves the stored expiries by the
difference when the group is next loaded, so every key lives the current ttl from its last
batch with rows (or its latest event time), as Flink applies the current ttl."""

CHECKED_WHEN_PRESENT = (EXPIRY_CLOCK,)
"""Checked settings without a default: checked only where the stored state has them."""


def encode(table: pd.DataFrame, schema: pa.Schema) -> bytes:
    """Serialize ``table`` (columns named as in ``schema``) to Arrow IPC stream bytes."""
    arrow_table = pa.Table.from_pandas(
        table, schema=schema, preserve_index=False, safe=False, nthreads=1
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(arrow_table)
    return sink.getvalue().to_pybytes()


def decode(operator: str, row: tuple, schema: pa.Schema) -> pd.DataFrame:
    """Decode a stored state row; raise StateSchemaMismatchError saying what changed."""
    if len(row) != 3:
        raise StateSchemaMismatchError(
            f"{operator}: stored state row has {len(row)} fields, expected 3"
            f" ({GROUP_STATE_DDL}); restart from a new checkpoint location"
        )
    format_version, stored_operator, blob = row
    if format_version != STATE_FORMAT_VERSION:
        raise StateSchemaMismatchError(
            f"{operator}: stored state has format version {format_version}, this code reads"
            f" version {STATE_FORMAT_VERSION}; restart from a new checkpoint location"
        )
    if stored_operator != operator:
        raise StateSchemaMismatchError(
            f"{operator}: stored state was written by operator {stored_operator!r};"
            " restart from a new checkpoint location"
        )
    arrow_table = pa.ipc.open_stream(bytes(blob)).read_all()
    check_schema(operator, arrow_table.schema, schema)
    return arrow_table.to_pandas()


def check_schema(operator: str, stored: pa.Schema, schema: pa.Schema) -> None:
    """Raise StateSchemaMismatchError unless ``stored`` (a state table's schema) has the
    checked settings and the columns of ``schema`` (what this query declares)."""
    stored_settings = {**SETTING_DEFAULTS, **(stored.metadata or {})}
    declared_settings = {**SETTING_DEFAULTS, **(schema.metadata or {})}
    for name, value in declared_settings.items():
        if name in CHECKED_WHEN_PRESENT and name not in stored_settings:
            continue
        if name == EXPIRY_CLOCK and stored_settings[name] != value:
            raise StateSchemaMismatchError(
                f"{operator}: {expiry_clock_change(stored_settings[name], value)}; or restart"
                " from a new checkpoint location"
            )
        if stored_settings.get(name) != value:
            kept = stored_settings.get(name, b"?").decode()
            raise StateSchemaMismatchError(
                f"{operator}: stored state was written with {name.decode()}={kept}, this"
                f" query declares {name.decode()}={value.decode()}; keep {name.decode()}={kept}"
                " for this checkpoint or restart from a new checkpoint location"
            )
    if not stored.equals(schema):
        raise StateSchemaMismatchError(
            f"{operator}: stored state schema changed:"
            f" {describe_change(stored, schema)};"
            " restart from a new checkpoint location"
        )


def expiry_clock_change(stored: bytes | str, declared: bytes | str) -> str:
    """What a change of deduplicate's expiry clock is, and its fix, for a one-line error."""
    stored_clock = stored.decode() if isinstance(stored, bytes) else stored
    declared_clock = declared.decode() if isinstance(declared, bytes) else declared
    fix = "set event_time= again" if stored_clock == "event" else "drop event_time"
    return (
        f"its state keeps expiries in {stored_clock} time and this query in {declared_clock}"
        f" time (event_time {'set' if declared_clock == 'event' else 'unset'}), so every key"
        f" would be forgotten or remembered by the other clock; {fix} for it"
    )


def stored_metadata(row: tuple, key: bytes) -> str | None:
    """The value of ``key`` in a stored state row's Arrow schema metadata (None: absent);
    reads the Arrow schema only."""
    blob = row[2] if len(row) == 3 else None
    if blob is None:
        return None
    value = (pa.ipc.open_stream(bytes(blob)).schema.metadata or {}).get(key)
    return value.decode() if value is not None else None


def stored_name(row: tuple) -> str | None:
    """The operator name a stored state row was written with (None: an unnamed operator,
    or a row written before names existed)."""
    return stored_metadata(row, OPERATOR_NAME_METADATA_KEY)


def describe_change(stored: pa.Schema, declared: pa.Schema) -> str:
    """One line listing removed, added and retyped state columns."""
    stored_types = {f.name: f.type for f in stored}
    declared_types = {f.name: f.type for f in declared}
    parts = []
    removed = [n for n in stored_types if n not in declared_types]
    added = [n for n in declared_types if n not in stored_types]
    retyped = [
        f"{n} {stored_types[n]} -> {declared_types[n]}"
        for n in declared_types
        if n in stored_types and stored_types[n] != declared_types[n]
    ]
    if removed:
        parts.append(f"stored columns no longer declared: {', '.join(removed)}")
    if added:
        parts.append(f"declared columns missing from stored state: {', '.join(added)}")
    if retyped:
        parts.append(f"retyped: {', '.join(retyped)}")
    return "; ".join(parts) or "column order differs"
