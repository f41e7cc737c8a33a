"""Properties of the pure logic, checked on generated inputs (hypothesis): the connectors'
durations, the Kafka source's offset planning, and the 2pc-s3 key layout (the grammars of
``OptionReader`` themselves are checked in test_option_reader.py).
Example-based tests of the same code (exact messages, Spark's rules) are in the other files."""

from __future__ import annotations

import datetime
import itertools
import string
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eospack.commit_protocols import PreparedPiece
from eospack.connectors.jdbc.errors import JdbcSinkOptionError
from eospack.connectors.jdbc.options import parse_options as parse_jdbc_options
from eospack.connectors.kafka.source.broker_metadata import ClusterView
from eospack.connectors.kafka.source.offset_format import BatchOffsets
from eospack.connectors.kafka.source.offset_ranges import OffsetRange, rate_limit, split_ranges
from eospack.connectors.kafka.source.options import parse_options as parse_kafka_options
from eospack.connectors.kafka.source.planning import plan_next_batch, plan_ranges
from eospack.connectors.s3.keys import (
    HIVE_DEFAULT_PARTITION,
    escape_path_name,
    object_key,
    partition_directory,
    partition_values_of_key,
    transaction_id_of_key,
    unescape_path_name,
)
from eospack.stateful_ops.validation import OperatorDefinitionError, duration_ms

FAST = settings(max_examples=200, deadline=None)

TopicPartition = tuple[str, int]

# --- durations -----------------------------------------------------------------------------

amounts = st.integers(min_value=1, max_value=10**9)
spaces = st.sampled_from(["", " ", "  "])


JDBC_BASE = {"url": "jdbc:postgresql://db.example:5433/shop", "dbtable": "sales.orders"}
JDBC_UNITS_MS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


@FAST
@given(amounts, st.sampled_from(sorted(JDBC_UNITS_MS)), spaces, st.booleans())
def test_jdbc_lock_timeout_is_amount_times_unit(
    amount: int, unit: str, gap: str, upper: bool
) -> None:
    text = f"{amount}{gap if unit else ''}{unit}"
    options = parse_jdbc_options({**JDBC_BASE, "locktimeout": text.upper() if upper else text})
    assert options.lock_timeout_ms == amount * JDBC_UNITS_MS[unit]


@FAST
@given(st.sampled_from(sorted(JDBC_UNITS_MS)))
def test_jdbc_lock_timeout_of_zero_is_refused(unit: str) -> None:
    with pytest.raises(JdbcSinkOptionError, match="use a positive duration such as"):
        parse_jdbc_options({**JDBC_BASE, "locktimeout": f"0{unit}"})


KAFKA_BASE = {"kafka.bootstrap.servers": "broker1:9092", "subscribe": "orders"}
KAFKA_UNITS_MS = {
    "": 1,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


@FAST
@given(
    st.integers(min_value=0, max_value=10**9),
    st.sampled_from(sorted(KAFKA_UNITS_MS)),
    spaces,
    spaces,
)
def test_kafka_max_trigger_delay_is_amount_times_unit(
    amount: int, unit: str, gap: str, around: str
) -> None:
    text = f"{around}{amount}{gap if unit else ''}{unit}{around}"
    options = parse_kafka_options({**KAFKA_BASE, "maxtriggerdelay": text})
    assert options.max_trigger_delay_ms == amount * KAFKA_UNITS_MS[unit]


OPERATOR_UNITS_MS = {
    "ms": 1,
    "milliseconds": 1,
    "s": 1000,
    "seconds": 1000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "days": 86_400_000,
}


@FAST
@given(amounts, st.sampled_from(sorted(OPERATOR_UNITS_MS)), spaces, st.booleans())
def test_operator_duration_text_is_amount_times_unit(
    amount: int, unit: str, gap: str, upper: bool
) -> None:
    text = f"{amount}{gap}{unit}"
    expected = amount * OPERATOR_UNITS_MS[unit]
    if expected > 36_500 * OPERATOR_UNITS_MS["days"]:  # the longest duration accepted
        with pytest.raises(OperatorDefinitionError, match="longer than 36500 days"):
            duration_ms("running_count", "timeout", text.upper() if upper else text)
        return
    parsed = duration_ms("running_count", "timeout", text.upper() if upper else text)
    assert parsed == expected


@FAST
@given(
    st.timedeltas(
        min_value=datetime.timedelta(milliseconds=1), max_value=datetime.timedelta(days=10_000)
    )
)
def test_operator_duration_of_timedelta_is_its_whole_milliseconds(
    delta: datetime.timedelta,
) -> None:
    assert duration_ms("running_count", "timeout", delta) == delta // datetime.timedelta(
        milliseconds=1
    )


@FAST
@given(st.timedeltas(max_value=datetime.timedelta(microseconds=999)))
def test_operator_duration_below_a_millisecond_is_refused(delta: datetime.timedelta) -> None:
    with pytest.raises(OperatorDefinitionError, match="must be positive"):
        duration_ms("running_count", "timeout", delta)


# --- Kafka offset planning ------------------------------------------------------------------

topic_partitions = st.tuples(st.sampled_from(["a", "b", "orders"]), st.integers(0, 5))
backlogs = st.dictionaries(
    topic_partitions,
    st.tuples(st.integers(0, 10**12), st.integers(0, 10**6)),  # (start, offsets available)
    min_size=1,
    max_size=8,
)


def covered(ranges: list[OffsetRange]) -> dict[TopicPartition, list[tuple[int, int]]]:
    """Per topic-partition, the ranges' [start, end) in offset order."""
    result: dict[TopicPartition, list[tuple[int, int]]] = {}
    for r in ranges:
        result.setdefault((r.topic, r.partition), []).append((r.start, r.end))
    return {tp: sorted(spans) for tp, spans in result.items()}


def assert_exact_cover(
    ranges: list[OffsetRange],
    begins: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
) -> None:
    """The ranges are non-empty, never overlap, and cover exactly [begin, end) of each
    topic-partition (and nothing of one whose begin equals its end)."""
    assert all(r.size > 0 for r in ranges)
    expected = {tp for tp in ends if ends[tp] > begins[tp]}
    spans = covered(ranges)
    assert set(spans) == expected
    for tp, pieces in spans.items():
        assert pieces[0][0] == begins[tp] and pieces[-1][1] == ends[tp]
        for (_, end), (next_start, _) in itertools.pairwise(pieces):
            assert end == next_start


@FAST
@given(backlogs, st.one_of(st.none(), st.integers(1, 64)))
def test_split_ranges_cover_each_range_exactly(
    backlog: dict[TopicPartition, tuple[int, int]], min_partitions: int | None
) -> None:
    begins = {tp: start for tp, (start, _) in backlog.items()}
    ends = {tp: start + size for tp, (start, size) in backlog.items()}
    ranges = [OffsetRange(t, p, begins[(t, p)], ends[(t, p)]) for t, p in sorted(backlog)]
    split = split_ranges(ranges, min_partitions)
    assert_exact_cover(split, begins, ends)


@FAST
@given(backlogs, st.integers(1, 10**7))
def test_rate_limit_stays_within_the_backlog_and_near_max_offsets(
    backlog: dict[TopicPartition, tuple[int, int]], max_rows: int
) -> None:
    begins = {tp: start for tp, (start, _) in backlog.items()}
    latest = {tp: start + size for tp, (start, size) in backlog.items()}
    limited = rate_limit(max_rows, begins, latest, {})
    assert set(limited) == set(latest)
    waiting = [tp for tp in latest if latest[tp] > begins[tp]]
    for tp in latest:
        assert begins[tp] <= limited[tp] <= latest[tp]
    # As Spark's Kafka source: every partition with a backlog gets at least one offset, so
    # a batch may exceed maxOffsetsPerTrigger by at most one offset per such partition.
    assert all(limited[tp] > begins[tp] for tp in waiting)
    assert sum(limited[tp] - begins[tp] for tp in latest) <= max_rows + len(waiting)


@FAST
@given(backlogs, st.one_of(st.none(), st.integers(1, 10**7)), st.integers(1, 16))
def test_planned_batch_reads_exactly_the_offsets_after_the_previous_one(
    backlog: dict[TopicPartition, tuple[int, int]], max_rows: int | None, min_partitions: int
) -> None:
    """Previous batch ends -> next batch (plan, rate limit, logged offsets, read ranges):
    the read ranges start where the previous batch ended, end at the logged ends, never
    pass the latest offsets, and overlap nowhere."""
    previous_ends = {tp: start for tp, (start, _) in backlog.items()}
    latest = {tp: start + size for tp, (start, size) in backlog.items()}
    previous = BatchOffsets(previous_ends, {}, {})
    view = ClusterView(tuple(sorted(latest)), frozenset(t for t, _ in latest), {})

    def no_earliest_needed(partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise AssertionError(f"no partition is new or went back: {partitions}")

    plan = plan_next_batch(previous, view, latest, no_earliest_needed, fail_on_data_loss=True)
    assert plan.begins == previous_ends and plan.limits == latest
    ends = rate_limit(max_rows, plan.begins, plan.limits, {}) if max_rows else plan.limits
    logged = BatchOffsets.from_json(BatchOffsets(ends, plan.begins, plan.topic_ids).to_json())
    assert logged.ends == ends
    ranges = split_ranges(logged.ranges(), min_partitions)
    assert_exact_cover(ranges, previous_ends, ends)
    assert all(ends[tp] <= latest[tp] for tp in latest)


@FAST
@given(backlogs, st.dictionaries(topic_partitions, st.integers(0, 10**6), max_size=4))
def test_ranges_of_old_offsets_start_where_the_last_batch_ended(
    backlog: dict[TopicPartition, tuple[int, int]], new_partitions: dict[TopicPartition, int]
) -> None:
    """Offsets logged without starts: known partitions continue at the previous end, new
    ones start at their earliest offset (asked once, only for them)."""
    start = {tp: begin for tp, (begin, _) in backlog.items()}
    end = {tp: begin + size for tp, (begin, size) in backlog.items()}
    earliest = {tp: 0 for tp in new_partitions if tp not in start}
    end.update({tp: new_partitions[tp] for tp in earliest})
    asked: list[list[TopicPartition]] = []

    def earliest_of(partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        asked.append(partitions)
        return {tp: earliest[tp] for tp in partitions}

    ranges = plan_ranges(start, end, earliest_of, fail_on_data_loss=True)
    assert [(r.topic, r.partition) for r in ranges] == sorted(end)
    assert all(
        (r.start, r.end)
        == ({**start, **earliest}[(r.topic, r.partition)], end[(r.topic, r.partition)])
        for r in ranges
    )
    assert asked == ([sorted(earliest)] if earliest else [])


# --- 2pc-s3 key layout ----------------------------------------------------------------------

names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@FAST
@given(names)
def test_unescape_undoes_escape(text: str) -> None:
    escaped = escape_path_name(text)
    assert "/" not in escaped and "=" not in escaped
    assert unescape_path_name(escaped) == text


partition_values = st.one_of(
    st.none(),
    names.filter(lambda text: text != HIVE_DEFAULT_PARTITION),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.dates(),
)


def as_text(value: object) -> str | None:
    """How a partition value reads back from its directory (the reader casts it later)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


@FAST
@given(st.lists(st.tuples(names, partition_values), max_size=4, unique_by=lambda pair: pair[0]))
def test_partition_values_of_key_read_back_partition_directory(
    columns_and_values: list[tuple[str, object]],
) -> None:
    columns = [column for column, _ in columns_and_values]
    values = [value for _, value in columns_and_values]
    directory = partition_directory(columns, values)
    key = f"{directory}eospack-s1-0-0-a0.00001.parquet"
    assert partition_values_of_key(key) == {
        column: as_text(value) for column, value in columns_and_values
    }


sink_ids = st.text(string.ascii_letters + string.digits + "_", min_size=1, max_size=64)
attempts = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=12)
prefixes = st.lists(
    st.text(string.ascii_lowercase + string.digits + "-_", min_size=1, max_size=8),
    min_size=1,
    max_size=3,
).map("/".join)


@FAST
@given(
    prefixes,
    sink_ids,
    st.integers(0, 10**9),
    st.integers(0, 10**5),
    attempts,
    st.lists(st.tuples(names, partition_values), max_size=3, unique_by=lambda p: p[0]),
    st.integers(1, 99_999),
    st.sampled_from(["parquet", "jsonl"]),
)
def test_object_key_carries_its_transaction_id_and_directory(
    prefix: str,
    sink_id: str,
    batch_id: int,
    partition_id: int,
    attempt: str,
    columns_and_values: list[tuple[str, object]],
    number: int,
    extension: str,
) -> None:
    transaction = PreparedPiece(sink_id, batch_id, partition_id, attempt, 0).transaction_id
    columns = [column for column, _ in columns_and_values]
    directory = partition_directory(columns, [value for _, value in columns_and_values])
    key = object_key(prefix, directory, transaction, number, extension)
    assert transaction_id_of_key(prefix, key) == transaction
    assert partition_values_of_key(key[len(prefix) + 1 :]) == {
        column: as_text(value) for column, value in columns_and_values
    }
    assert transaction_id_of_key(f"{prefix}x", key) is None
    assert transaction_id_of_key(prefix, f"{prefix}/_eospack/{key[len(prefix) + 1 :]}") is None
