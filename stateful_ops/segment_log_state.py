"""The segment-log layout (``state_layout="segment-log"``): a key group's state as a
``transformWithStateInPandas`` ListState of Arrow segments (``segment_log``).

Why: a ``GroupState`` row holds a key group's whole table, so a batch that touches one key
rewrites the group (benchmark 17: 964x Spark's built-in count's state bytes per sparse
batch). Here a batch appends one segment holding only the keys whose state row changed
(plus tombstones for the keys it removed), and RocksDB's changelog holds just that
segment; a log longer than twice its live keys is compacted to one segment of live rows.

Only what touches the state store differs from the key-groups layout: grouping (by key
group, so rescaling by savepoint keeps its meaning), the operator logic (``step``,
``update``, ``canonical``) and the settings markers are the operator's own. The stored
settings (``key_groups``, key columns, state schema, ``ttl_time``/``timers``) sit in a
ValueState of the settings key group (``SETTINGS_KEY_GROUP``) as the key-groups layout's
settings row, and in every segment's Arrow schema; both are checked as in that layout.

Guarantees: as the key-groups layout's. TWS state is committed with the batch (RocksDB),
so after a restart every key group's log is the log at the last committed batch, and a
replayed batch (same batch timestamp) rewrites the same segments. Needs RocksDB (Spark
refuses TWS on another provider; so do we, before the query starts).
Timeouts (``ttl`` in either time, ``timers``, deduplicate, sessionize) fire through one
TWS timer per key group at its next wake-up, into the shared ``step``, in the TWS time
mode of the operator's timeout: "ProcessingTime", or "EventTime", where the timer fires
once the watermark reaches the wake-up, Spark drops the rows at or behind the previous
batch's watermark and runs a no-data batch when the watermark moves, all as it does for
GroupState's EventTimeTimeout; the clock's watermark is TWS's (the batch's, as
GroupState's), floored by a restored query's watermark, and a restored query drops the
rows the old query would have dropped (``without_late_rows``), as the key-groups layout
does. So event-time results equal the key-groups layout's, row for row
(integration_tests/stateful/test_segment_log_event_time.py). A key group's log keeps one
row per ``log_key_columns`` (the key columns; sessionize adds ``session_start_us``, as a
key may hold several open sessions). pyspark's streaming imports are heavy, so the
StatefulProcessor class is built on first use.

Savepoints: ``read_state`` and savepoints read a log folded (``folded_log``), the latter
on the executors as the key-groups layout's state rows (``state_reader.stored_groups``),
so a savepoint's rows and format are the key-groups layout's and it restores into
either layout. Restores (``initial_state``) run the key-groups bootstrap
(``initial_state``): the same split by key group (rescaling), bootstrap markers to every
key group, and a group without a log loads its split and writes it as its first segment
(``handle_rows``); ``initial_state.bootstrap_needed`` reads which groups hold a log.
Why not TWS's own ``initialState`` + ``handleInitialState`` (pyspark 4.0+), though it
would need no markers: Spark groups the initial state by the grouping key inside the
query's first batch, so every start before that batch commits shuffles the whole
savepoint again (the split is one job, written once and reused by every restart), and it
would be a second restore path beside the key-groups one, with its own handling of ttl,
timers and settings through a savepoint (``with_expiry_of``, ``with_timer_column_of``,
the settings checks of ``split_by_key_group``) to keep equal; one path serves both
layouts, and the crash and rescaling cases tested for it hold for both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from . import state_codec
from .errors import OperatorDefinitionError
from .operators.shared import key_codes
from .segment_log import TOMBSTONE_COLUMN, as_segment, fold, next_write
from .state_store import PROVIDER_CONF, PROVIDERS

if TYPE_CHECKING:
    from .base import Clock, StatefulOperator

LAYOUT = "segment-log"


class Layout(NamedTuple):
    """What the segment log takes from ``base`` (which imports this module): the settings
    key group, the clock type and the column flagging bootstrap markers."""

    settings_key_group: int
    clock: Callable[[int, int | None], Clock]
    marker_column: str


LOG_STATE = "segments"
"""The ListState of a key group's segments (one Arrow IPC stream per element)."""
SETTINGS_STATE = "settings"
"""The ValueState of the settings key group: the key-groups layout's settings row."""
SEGMENT_DDL = "segment binary"
TIME_MODES = {"none": "None", "processing": "ProcessingTime", "event": "EventTime"}
"""TWS's time mode for an operator's ``timeout``."""
OPERATOR_METADATA_KEY = b"operator"
KEY_COLUMNS_METADATA_KEY = b"key_columns"
"""A segment's schema metadata: the columns ``fold`` keeps a row per (a JSON list): the key
columns, plus ``session_start_us`` for sessionize (``log_key_columns``)."""


def refuse_other_store(df: DataFrame) -> None:
    """transformWithStateInPandas runs on RocksDB only: refuse another provider in one line."""
    provider = df.sparkSession.conf.get(PROVIDER_CONF, None)
    if provider != PROVIDERS["rocksdb"]:
        raise OperatorDefinitionError(
            f"state_layout='{LAYOUT}' needs the RocksDB state store ({PROVIDER_CONF}="
            f"{provider}); call configure_state_store(spark, 'rocksdb') before the query starts"
        )


def apply(
    operator: StatefulOperator, bucketed: DataFrame, key_group_column: str, layout: Layout
) -> DataFrame:
    """``bucketed`` (rows with their key group in ``key_group_column``, settings markers
    included) through the operator on the segment log; the output has
    ``operator.out_schema``."""
    refuse_other_store(bucketed)
    return bucketed.groupBy(key_group_column).transformWithStateInPandas(
        processor_class()(operator, tuple(bucketed.columns), layout),
        operator.out_schema,
        operator.output_mode.capitalize(),
        # Timeouts (ttl, timers, deduplicate, sessionize) fire through one TWS timer per
        # key group, in the operator's time. In "EventTime" mode Spark drops the rows at or
        # behind the watermark, as it does before GroupState's event-time timeout, and
        # runs a no-data batch when the watermark moves. Without timeouts no time mode:
        # Spark's "ProcessingTime" mode runs a no-data batch after every batch (as
        # GroupState's processing-time timeout does), and the clock's processing time is
        # then -1 (see ``handle_rows``).
        TIME_MODES[operator.timeout],
    )


def segment_schema(operator: StatefulOperator) -> pa.Schema:
    """The Arrow schema segments are written with: the stored state schema (settings and
    name in its metadata) plus the tombstone flag; the metadata also names the operator's
    kind and key columns, so that ``read_state`` can fold a log without the operator."""
    stored = operator.stored_schema()
    metadata = {
        **(stored.metadata or {}),
        OPERATOR_METADATA_KEY: operator.name.encode(),
        KEY_COLUMNS_METADATA_KEY: json.dumps(list(operator.log_key_columns())).encode(),
    }
    return stored.append(pa.field(TOMBSTONE_COLUMN, pa.bool_(), nullable=True)).with_metadata(
        metadata
    )


def encode_segment(segment: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, segment.schema) as writer:
        writer.write_table(segment)
    return cast(bytes, sink.getvalue().to_pybytes())


def checked_schema(operator: StatefulOperator) -> pa.Schema:
    """What a stored segment is checked against: the state schema's checked settings and
    columns plus the tombstone flag. The rest of ``segment_schema``'s metadata (the
    operator's name, ``ttl_ms``, kind and key columns) is informational, as in the
    key-groups layout: a name may be added and ttl changed on a checkpoint."""
    state_schema = operator.arrow_state_schema
    return state_schema.append(pa.field(TOMBSTONE_COLUMN, pa.bool_(), nullable=True)).with_metadata(
        state_schema.metadata
    )


def with_current_ttl(operator: StatefulOperator, segment: pa.Table) -> pa.Table:
    """``segment`` with its expiries moved by the change of ttl since it was written (its
    ``TTL_MS``), as ``base.load_value`` moves a key-groups row's: every key lives the
    current ttl from its last batch with rows. Tombstones' null expiries stay null."""
    return with_ttl(segment, operator.ttl_ms)


def with_ttl(segment: pa.Table, ttl_ms: int | None) -> pa.Table:
    """``segment`` with its expiries moved from the ttl it was written with (its
    ``TTL_MS``) to ``ttl_ms`` (None, or a segment without ttl: unchanged)."""
    written = (segment.schema.metadata or {}).get(state_codec.TTL_MS)
    if ttl_ms is None or written is None or int(written) == ttl_ms:
        return segment
    if state_codec.EXPIRES_COLUMN not in segment.column_names:
        return segment
    position = segment.schema.get_field_index(state_codec.EXPIRES_COLUMN)
    expires = segment[state_codec.EXPIRES_COLUMN]
    moved = pc.add(expires, pa.scalar(ttl_ms - int(written), expires.type))
    return segment.set_column(position, segment.schema.field(position), moved)


def folded_log(segments: list[pa.Table]) -> pa.Table:
    """A stored log's live rows (``fold``) without the operator: what ``read_state`` and
    savepoints read. Its schema metadata is the last segment's (the stored schema, the
    operator's kind) without the key columns; expiries are at that segment's ttl, as a
    key-groups row holds all its keys' at the ttl of its last write (a log keeps the
    segments written before a change of ttl as they were)."""
    metadata = dict(segments[-1].schema.metadata or {})
    keys = json.loads(metadata.pop(KEY_COLUMNS_METADATA_KEY).decode())
    written = metadata.get(state_codec.TTL_MS)
    if written is not None:
        segments = [with_ttl(segment, int(written)) for segment in segments]
    return fold(segments, keys).replace_schema_metadata(metadata)


def operator_layout(spark: SparkSession, checkpoint_location: str, operator_id: int) -> str:
    """The operator's state layout: "segment-log" when Spark's operator metadata names it
    ``transformWithStateInPandasExec``, else "key-groups"."""
    operators = (
        spark.read.format("state-metadata")
        .load(checkpoint_location)
        .where(f"operatorId = {int(operator_id)}")
        .select("operatorName")
        .distinct()
        .collect()
    )
    if any(str(row[0]).startswith("transformWithState") for row in operators):
        return LAYOUT
    return "key-groups"


def state_variable(
    spark: SparkSession,
    checkpoint_location: str,
    batch_id: int | None,
    operator_id: int,
    name: str,
) -> DataFrame:
    """Spark's state data source on state variable ``name`` (``LOG_STATE`` as one row per
    key group holding its whole list, ``SETTINGS_STATE``) of a segment-log operator."""
    reader = (
        spark.read.format("statestore")
        .option("operatorId", operator_id)
        .option("stateVarName", name)
        .option("flattenCollectionTypes", "false")
    )
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return reader.load(checkpoint_location)


def settings_rows(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None, operator_id: int
) -> DataFrame:
    """The settings ValueState of a segment-log operator as the key-groups layout's state
    rows (``key_group, format_version, operator, blob``): the settings key group's row."""
    values = state_variable(spark, checkpoint_location, batch_id, operator_id, SETTINGS_STATE)
    rows = values.selectExpr("key.*", "value.*").toDF(
        "key_group", "format_version", "operator", "blob"
    )
    return rows.withColumn("key_group", rows["key_group"].cast("long"))


def read_log(
    operator: StatefulOperator, values: Iterator[tuple[Any, ...]]
) -> tuple[list[pa.Table], int]:
    """A key group's segments, each checked against the declared settings and schema and
    with its expiries at the current ttl (``with_current_ttl``), and their encoded bytes."""
    declared = checked_schema(operator)
    segments = []
    logged_bytes = 0
    for (blob,) in values:
        logged_bytes += len(blob)
        segment = pa.ipc.open_stream(bytes(blob)).read_all()
        state_codec.check_schema(operator.name, segment.schema, declared)
        segments.append(with_current_ttl(operator, segment))
    return segments, logged_bytes


def live_table(operator: StatefulOperator, frame: pd.DataFrame) -> pa.Table:
    """A state frame as an Arrow table of the state schema (as ``state_codec.encode``)."""
    schema = operator.arrow_state_schema
    return pa.Table.from_pandas(
        frame[schema.names], schema=schema, preserve_index=False, safe=False, nthreads=1
    )


def change(
    operator: StatefulOperator, stored: pa.Table, new: pa.Table
) -> tuple[pa.Table, pa.Table]:
    """(rows of ``new`` whose key is new or whose state row differs from ``stored``'s, the
    key columns of the keys of ``stored`` that ``new`` no longer holds); a key here is the
    operator's ``log_key_columns``."""
    keys = list(operator.log_key_columns())
    both = pd.concat(
        [stored.select(keys).to_pandas(), new.select(keys).to_pandas()], ignore_index=True
    )
    codes, _ = key_codes(both, keys)
    stored_codes, new_codes = codes[: stored.num_rows], codes[stored.num_rows :]
    position = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
    position[stored_codes] = np.arange(stored.num_rows)
    matched = position[new_codes]
    known = matched >= 0
    changed = ~known
    if known.any():
        old = stored.take(pa.array(matched[known]))
        current = new.filter(pa.array(known))
        same = np.ones(int(known.sum()), dtype=bool)
        for name in operator.arrow_state_schema.names:
            if name in keys:
                continue
            left, right = old[name], current[name]
            equal = pc.fill_null(pc.equal(left, right), False)
            both_null = pc.and_(pc.is_null(left), pc.is_null(right))
            same &= pc.or_(equal, both_null).to_numpy(zero_copy_only=False)
        changed[np.flatnonzero(known)[~same]] = True
    kept = np.zeros(int(codes.max()) + 1 if len(codes) else 0, dtype=bool)
    kept[new_codes] = True
    removed = stored.select(keys).filter(pa.array(~kept[stored_codes]))
    return new.filter(pa.array(changed)), removed


class ValueStateAsGroupState:
    """The settings ValueState seen through the part of GroupState ``check_settings``
    uses (``exists``, ``get``, ``update``), so the settings check is the layouts' one."""

    def __init__(self, value_state: Any) -> None:
        self.value_state = value_state

    @property
    def exists(self) -> bool:
        return bool(self.value_state.exists())

    @property
    def get(self) -> tuple[Any, ...]:
        return tuple(self.value_state.get())

    def update(self, value: tuple[Any, ...]) -> None:
        self.value_state.update(value)


def handle_rows(
    operator: StatefulOperator,
    layout: Layout,
    handle: Any,
    key_group: int,
    frames: Iterator[pd.DataFrame] | None,
    processing_time_ms: int,
    watermark_ms: int | None = None,
) -> Iterator[pd.DataFrame]:
    """One key group's call: the key-groups layout's ``_call`` with the segment log as
    store. ``frames`` None: the group's timer fired (a visit without data: ``step``
    expires what is due). Without a time mode Spark gives no batch timestamp: the clock's
    processing time is ``processing_time_ms`` as Spark passes it (-1). The clock's
    watermark is ``watermark_ms`` (TWS's, the batch's watermark for eviction, as
    GroupState's) with event-time timeouts, else None.

    Bootstrapping (``operator.bootstrap_directory``: restored, some key group without a
    log yet): bootstrap markers visit every key group; a group without a log loads its
    keys from the split, and its first segment is its whole state after the call (empty
    too: a log, even of one empty segment, says the group loaded its keys, so it never
    loads them again, and a log is never cleared meanwhile). A group with a log that gets
    markers alone is left as it is (its TWS timer, unlike GroupState's timeout, stays).
    Restored with event-time timeouts, rows the old query would have dropped as late are
    dropped (``without_late_rows``)."""
    if key_group == layout.settings_key_group:
        for _ in frames or ():
            pass
        operator.check_settings(cast(Any, ValueStateAsGroupState(handle.settings)))
        return
    if operator.metrics_directory is not None:
        from eospack.core.metrics import RECORDER

        RECORDER.point_at(operator.metrics_directory)
    bootstrap = operator.bootstrap_directory
    if frames is not None and bootstrap is not None:
        marker = layout.marker_column
        frames = (frame.loc[~frame[marker].to_numpy(dtype=bool)] for frame in frames)
    if frames is not None and operator.watermarked_column() is not None:
        frames = operator.without_late_rows(frames)
    rows = operator.fold(frames) if frames is not None else None
    log = handle.log
    logged = bool(log.exists())
    first = bootstrap is not None and not logged
    if rows is not None and not len(rows) and not first:
        return
    clock = layout.clock(processing_time_ms, operator.floored_watermark(watermark_ms))
    segments, logged_bytes = read_log(operator, log.get()) if logged else ([], 0)
    empty = as_segment(operator.arrow_state_schema.empty_table())
    log_keys = list(operator.log_key_columns())
    stored_table = fold(segments or [empty], log_keys).cast(operator.arrow_state_schema)
    stored = operator.canonical_state(stored_table.to_pandas())
    if first:
        initial = operator.initial_state_of(key_group)
        if initial is not None:
            stored = initial
    if rows is not None and not len(rows):
        # Markers alone (a first visit): a visit without data, as the key-groups layout's.
        if operator.due(stored, clock):
            new_state, output = operator.step(None, stored, clock)
        else:
            new_state, output = stored, operator.empty_output()
    else:
        new_state, output = operator.step(rows, stored, clock)
    new_table = live_table(operator, new_state)
    # A first segment holds every key (``stored_table`` is the empty log's).
    changed_rows, removed = change(operator, stored_table, new_table)
    if changed_rows.num_rows or removed.num_rows or first:
        schema = segment_schema(operator)
        segment = as_segment(changed_rows, removed).cast(schema)
        logged_rows = sum(s.num_rows for s in segments)
        write = next_write(logged_rows, new_table, segment)
        if write.replace and not new_table.num_rows and bootstrap is None:
            log.clear()
            logged_bytes = 0
        else:
            blob = encode_segment(write.segment.cast(schema))
            if write.replace:
                log.put([(blob,)])
                logged_bytes = len(blob)
            else:
                log.appendValue((blob,))
                logged_bytes += len(blob)
    if operator.timeout != "none":
        set_timer(operator, handle.timers, new_state, clock)
    # The gauge of the group's stored bytes: its log's encoded segments.
    operator.record_state(key_group, new_state, logged_bytes)
    if len(output):
        yield output[list(operator.out_schema.names)]


def set_timer(operator: StatefulOperator, timers: Any, state: pd.DataFrame, clock: Clock) -> None:
    """The group's one timer for its next wake-up (``next_wake_up_ms``), none without keys;
    a fired timer is gone, so exactly the group's current wake-up is registered. Spark
    fires a timer after the batch's rows (a group with rows then has expired its due keys
    itself, in ``step``), at the first batch whose timestamp, or watermark, is at or past
    it (checked on Spark 4.0.5, 4.1.4 and 4.3.0: a timer at the watermark fires in that
    batch).

    Processing time: at the wake-up, after this batch's time. Event time: at the wake-up,
    so it fires once the watermark reaches it, as ``set_timeout``'s GroupState timeout
    does; past the current watermark, so a wake-up this batch has reached (a timer
    ``on_timer`` set) fires at the next advance, again as GroupState's."""
    for registered in list(timers.listTimers()):
        timers.deleteTimer(registered)
    if not len(state):
        return
    wake_up = operator.next_wake_up_ms(state, clock)
    if wake_up is None:
        return
    if operator.timeout == "event":
        watermark = clock.watermark_ms if clock.watermark_ms is not None else 0
        timers.registerTimer(max(wake_up, watermark + 1))
    else:
        timers.registerTimer(max(wake_up, clock.processing_time_ms + 1))


def named(frames: Iterator[pd.DataFrame], columns: tuple[str, ...]) -> Iterator[pd.DataFrame]:
    """``frames`` with their columns named ``columns``: pyspark 4.1+ builds TWS frames
    from ``itertuples`` namedtuples, which rename columns starting with an underscore (the
    operators' ``__so_*`` columns) to their position; pyspark 4.0 passes the grouping key
    column first, before the input's columns."""
    for frame in frames:
        if len(frame.columns) == len(columns) + 1:
            frame = frame.iloc[:, 1:]
        if len(frame.columns) != len(columns):
            raise ValueError(
                f"segment log: a frame of {len(frame.columns)} columns, expected {columns}"
            )
        yield frame.set_axis(list(columns), axis=1)


@cache
def processor_class() -> type:
    """The StatefulProcessor running an operator on the segment log (built on first use:
    pyspark's streaming module is imported only by queries that choose this layout)."""
    from pyspark.sql.streaming import StatefulProcessor

    class SegmentLogProcessor(StatefulProcessor):  # type: ignore[misc]
        """Calls ``handle_rows`` per key group with its ListState and settings ValueState."""

        def __init__(
            self, operator: StatefulOperator, columns: tuple[str, ...], layout: Layout
        ) -> None:
            self.operator = operator
            self.columns = columns
            self.layout = layout

        def init(self, handle: Any) -> None:
            self.log = handle.getListState(LOG_STATE, SEGMENT_DDL)
            self.settings = handle.getValueState(SETTINGS_STATE, state_codec.GROUP_STATE_DDL)
            self.timers = handle

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            return handle_rows(
                self.operator,
                self.layout,
                self,
                int(key[0]),
                named(rows, self.columns),
                timerValues.getCurrentProcessingTimeInMs(),
                timerValues.getCurrentWatermarkInMs(),
            )

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[pd.DataFrame]:
            return handle_rows(
                self.operator,
                self.layout,
                self,
                int(key[0]),
                None,
                timerValues.getCurrentProcessingTimeInMs(),
                timerValues.getCurrentWatermarkInMs(),
            )

        def close(self) -> None:
            return None

    return SegmentLogProcessor
