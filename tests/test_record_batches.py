"""The native record-batch path (``eospack._native``) against its pure-Python reference
(kafka-python's record code), on generated rows and on hand-built batches.

What is held together: ``encode`` gives the same batches through both paths (partition,
record count, the sticky partition to continue with; identical bytes without compression,
identical records with a codec, whose compressed bytes differ between libraries); the
batches hold exactly the rows that went in; ``decode`` of any of them, at any fetch offset,
read_committed or not, with or without headers, gives identical Arrow tables and next fetch
offsets through both paths. Hand-built batches cover what a producer does not write itself:
control batches, aborted transactions, fetch offsets inside a batch, a partial batch at the
end of a response, compaction gaps, CRC mismatches, log-append time and legacy message sets.

Generated inputs are derandomized (the same examples on every run, so a failure reproduces
as it is); hypothesis prints the falsifying example and a ``@reproduce_failure`` blob.
Needs the built extension; skipped without it, except in CI (``CI`` set) unless
``EOSPACK_NATIVE=0`` chose the reference path: there a missing extension fails the module
rather than hiding it.
"""

from __future__ import annotations

import datetime
import os
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import DefaultPartitioner
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c

from eospack.connectors.kafka.errors import CorruptRecordsError, RecordRefusedError
from eospack.connectors.kafka.records import record_batches
from eospack.connectors.kafka.records.record_batches import (
    CODECS,
    HEADERS,
    DecodedRecords,
    EncodedBatch,
    EncodeSettings,
)

_CHOSE_REFERENCE = os.environ.get("EOSPACK_NATIVE", "1").strip().lower() in (
    "0",
    "false",
    "no",
    "off",
)
if record_batches.NATIVE is None and (_CHOSE_REFERENCE or not os.environ.get("CI")):
    pytest.skip(f"needs the native path: {record_batches.active_path()}", allow_module_level=True)

DIFFERENTIAL = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TOPIC = "differential"
TIMESTAMP_MS = 1_764_000_000_000
BYTE_TYPES = (pa.binary(), pa.string(), pa.large_binary(), pa.large_string())

Row = dict[str, Any]


def decode_both(raw: bytes, fetch_offset: int, **options: Any) -> DecodedRecords:
    """Decode through both paths, assert they agree, return the native result."""
    options.setdefault("read_committed", False)
    options.setdefault("include_headers", True)
    partition = options.pop("partition", 0)
    native = record_batches.decode(raw, fetch_offset, TOPIC, partition, native=True, **options)
    reference = record_batches.decode(raw, fetch_offset, TOPIC, partition, native=False, **options)
    assert native.batch.to_pylist() == reference.batch.to_pylist()
    assert native.batch.schema.equals(reference.batch.schema, check_metadata=True)
    assert native.batch.equals(reference.batch)
    assert native.next_fetch_offset == reference.next_fetch_offset
    assert native.leader_epoch == reference.leader_epoch
    return native


class OneTopicCluster:
    """What kafka-python's DefaultPartitioner asks of the cluster metadata."""

    def __init__(self, partitions: int) -> None:
        self.partitions = set(range(partitions))

    def topics(self) -> set[str]:
        return {TOPIC}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions


def default_partition(key: bytes, partitions: int) -> int:
    """kafka-python's DefaultPartitioner (murmur2 of the key, as the Java client)."""
    cluster = OneTopicCluster(partitions)
    return int(DefaultPartitioner().partition(TOPIC, key, key, None, None, cluster))


def as_bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


# --- generated rows ------------------------------------------------------------------------

STRING_VALUED_HEADERS = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.string())]))
)
"""Spark's Kafka sink takes header values of type string too."""


def header_lists(text_values: bool) -> st.SearchStrategy[list[dict[str, Any]] | None]:
    values: st.SearchStrategy[Any] = (
        st.text(st.characters(codec="utf-8"), max_size=8) if text_values else st.binary(max_size=16)
    )
    item = st.fixed_dictionaries(
        {
            "key": st.text(st.characters(codec="utf-8"), max_size=8),
            "value": st.one_of(st.none(), values),
        }
    )
    return st.one_of(st.none(), st.lists(item, max_size=4))


def payloads(arrow_type: pa.DataType) -> st.SearchStrategy[str | bytes | None]:
    """Null, empty, small, and now and then large (up to 300 kB) keys or values."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        small: st.SearchStrategy[Any] = st.text(st.characters(codec="utf-8"), max_size=24)
        large: st.SearchStrategy[Any] = st.builds(
            lambda character, size: character * size,
            st.characters(codec="utf-8"),
            st.integers(2_000, 100_000),
        )
    else:
        small = st.binary(max_size=24)
        large = st.builds(
            lambda byte, size: bytes([byte]) * size,
            st.integers(0, 255),
            st.integers(2_000, 300_000),
        )
    return st.one_of(st.none(), small, small, small, large)


@st.composite
def sink_rows(draw: st.DrawFn) -> tuple[pa.RecordBatch, int]:
    """Rows with the sink's columns (value; key, partition, headers each maybe absent) and
    the topic's partition count."""
    partitions = draw(st.integers(1, 4))
    count = draw(st.integers(0, 30))
    value_type = draw(st.sampled_from(BYTE_TYPES))
    columns: dict[str, pa.Array] = {
        "value": pa.array(
            draw(st.lists(payloads(value_type), min_size=count, max_size=count)), value_type
        )
    }
    key_type = draw(st.sampled_from((None, *BYTE_TYPES)))
    if key_type is not None:
        keys = draw(st.lists(payloads(key_type), min_size=count, max_size=count))
        columns["key"] = pa.array(keys, key_type)
    if draw(st.booleans()):
        wanted = st.one_of(st.none(), st.integers(0, partitions - 1))
        columns["partition"] = pa.array(
            draw(st.lists(wanted, min_size=count, max_size=count)), pa.int32()
        )
    if draw(st.booleans()):
        text_values = draw(st.booleans())
        columns["headers"] = pa.array(
            draw(st.lists(header_lists(text_values), min_size=count, max_size=count)),
            STRING_VALUED_HEADERS if text_values else HEADERS,
        )
    names = draw(st.permutations(list(columns)))
    return pa.RecordBatch.from_pydict({name: columns[name] for name in names}), partitions


encode_settings = st.builds(
    lambda max_batch_bytes, max_record_bytes, compression, timestamp_ms: (
        max_batch_bytes,
        max_record_bytes,
        compression,
        timestamp_ms,
    ),
    st.sampled_from([100, 300, 1_000, 16_384, 1 << 20]),
    st.sampled_from([2_000, 4 << 20]),
    st.sampled_from(sorted(CODECS)),
    st.integers(0, 2**42),
)


def expected_records(rows: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """(key, value, headers) per row as a reader gets them: bytes, and null headers for a
    record without any."""
    column = {name: rows.column(name).to_pylist() for name in rows.schema.names}
    nothing = [None] * rows.num_rows
    return [
        (
            as_bytes(key),
            as_bytes(value),
            [{"key": item["key"], "value": as_bytes(item["value"])} for item in headers or []]
            or None,
        )
        for key, value, headers in zip(
            column.get("key", nothing), column["value"], column.get("headers", nothing), strict=True
        )
    ]


def encode_both(
    rows: pa.RecordBatch, settings_: EncodeSettings, sticky: int
) -> tuple[list[EncodedBatch], int] | RecordRefusedError:
    """Encode through both paths, assert they agree, return the reference's batches (or
    the refusal both raised, with the same message)."""
    outcomes: list[Any] = []
    for native in (True, False):
        try:
            outcomes.append(record_batches.encode(rows, settings_, sticky, native=native))
        except RecordRefusedError as error:
            outcomes.append(error)
    native_outcome, reference_outcome = outcomes
    if isinstance(reference_outcome, RecordRefusedError) or isinstance(
        native_outcome, RecordRefusedError
    ):
        assert str(native_outcome) == str(reference_outcome)
        return reference_outcome
    (native_batches, native_sticky), (reference_batches, reference_sticky) = outcomes
    assert [(batch.partition, batch.records) for batch in native_batches] == [
        (batch.partition, batch.records) for batch in reference_batches
    ]
    assert native_sticky == reference_sticky
    if settings_.compression == "none":
        assert [bytes(batch.data) for batch in native_batches] == [
            bytes(batch.data) for batch in reference_batches
        ]
    for native_batch, reference_batch in zip(native_batches, reference_batches, strict=True):
        # Header fields beside length, CRC and the codec bits (a codec that does not gain
        # is dropped, and the libraries compress to different sizes).
        native_data, reference_data = bytes(native_batch.data), bytes(reference_batch.data)
        assert native_data[:8] == reference_data[:8]
        assert native_data[12:17] == reference_data[12:17]
        assert native_data[21] == reference_data[21]
        assert native_data[22] & ~0x07 == reference_data[22] & ~0x07
        assert native_data[23:61] == reference_data[23:61]
        native_decoded = decode_both(native_data, 0, partition=native_batch.partition)
        reference_decoded = decode_both(reference_data, 0, partition=reference_batch.partition)
        assert native_decoded.batch.equals(reference_decoded.batch)
    return reference_batches, reference_sticky


@DIFFERENTIAL
@given(sink_rows(), encode_settings, st.integers(0, 9))
def test_encode_gives_the_same_batches_through_both_paths(
    generated: tuple[pa.RecordBatch, int], options: tuple[int, int, str, int], sticky: int
) -> None:
    rows, partitions = generated
    max_batch_bytes, max_record_bytes, compression, timestamp_ms = options
    settings_ = EncodeSettings(
        partitions, max_batch_bytes, max_record_bytes, compression, timestamp_ms
    )
    outcome = encode_both(rows, settings_, sticky)
    if isinstance(outcome, RecordRefusedError):
        assert max_record_bytes == 2_000
        return
    batches, _ = outcome
    assert sum(batch.records for batch in batches) == rows.num_rows
    # Exactly the rows that went in, each once.
    decoded = sorted(
        repr(record) for batch in batches for record in records_of(batch, timestamp_ms)
    )
    assert decoded == sorted(repr(record) for record in expected_records(rows))


def records_of(batch: EncodedBatch, timestamp_ms: int = TIMESTAMP_MS) -> list[tuple[Any, ...]]:
    """(key, value, headers) of an encoded batch's records, decoded through both paths."""
    decoded = decode_both(bytes(batch.data), 0, partition=batch.partition).batch.to_pylist()
    assert [row["timestamp"] for row in decoded] == [
        datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.timezone.utc)
    ] * len(decoded)
    assert {row["timestampType"] for row in decoded} <= {0}
    return [(row["key"], row["value"], row["headers"]) for row in decoded]


@settings(DIFFERENTIAL, max_examples=50)
@given(sink_rows(), st.sampled_from([100, 1_000, 1 << 20]), st.integers(0, 9))
def test_rows_go_to_their_partition_in_row_order(
    generated: tuple[pa.RecordBatch, int], max_batch_bytes: int, sticky: int
) -> None:
    """A row's explicit partition, else its key's murmur2 partition (kafka-python's
    DefaultPartitioner), else the sticky one; row order kept within each partition, and
    rows without partition or key move on only when a batch fills (KIP-480)."""
    rows, partitions = generated
    values = rows.column("value").to_pylist()
    unique = pa.array(
        [b"%d:" % index + (as_bytes(value) or b"") for index, value in enumerate(values)]
    )
    rows = rows.set_column(rows.schema.get_field_index("value"), "value", unique)
    settings_ = EncodeSettings(partitions, max_batch_bytes, 4 << 20, "none", TIMESTAMP_MS)
    outcome = encode_both(rows, settings_, sticky)
    assert not isinstance(outcome, RecordRefusedError)
    batches, _ = outcome
    placed: dict[int, int] = {}
    for batch in batches:
        indexes = [int(value.split(b":")[0]) for _, value, _ in records_of(batch)]
        assert indexes == sorted(indexes)
        placed.update((index, batch.partition) for index in indexes)
    assert sorted(placed) == list(range(rows.num_rows))
    names = rows.schema.names
    wanted = rows.column("partition").to_pylist() if "partition" in names else [None] * len(values)
    keys = rows.column("key").to_pylist() if "key" in names else [None] * len(values)
    current = sticky % partitions
    for index in range(rows.num_rows):
        if wanted[index] is not None:
            assert placed[index] == wanted[index]
        elif keys[index] is not None:
            key = as_bytes(keys[index])
            assert placed[index] == default_partition(key, partitions)
        else:
            assert placed[index] in (current, (current + 1) % partitions)
            current = placed[index]


@DIFFERENTIAL
@given(
    sink_rows(),
    st.sampled_from(sorted(CODECS)),
    st.data(),
)
def test_decode_of_encoded_partitions_is_identical_through_both_paths(
    generated: tuple[pa.RecordBatch, int], compression: str, data: st.DataObject
) -> None:
    """Each partition's batches, laid one after another with consecutive offsets (as a
    Fetch response has them), some stamped transactional, decoded from any fetch offset."""
    rows, partitions = generated
    settings_ = EncodeSettings(partitions, 1_000, 4 << 20, compression, TIMESTAMP_MS)
    batches, _ = record_batches.encode(rows, settings_, 0, native=False)
    for partition in range(partitions):
        raw = bytearray()
        next_offset = data.draw(st.integers(0, 10**12), label="first offset")
        producer_id = data.draw(st.integers(0, 2**40), label="producer id")
        sequence = 0
        for batch in (batch for batch in batches if batch.partition == partition):
            stamped = bytearray(batch.data)
            if data.draw(st.booleans(), label="transactional"):
                reference_stamped = bytearray(stamped)
                record_batches.NATIVE.set_producer_state(stamped, producer_id, 3, sequence, True)
                record_batches.reference_set_producer_state(
                    reference_stamped, producer_id, 3, sequence, True
                )
                assert stamped == reference_stamped
                sequence += batch.records
            struct.pack_into(">q", stamped, 0, next_offset)
            raw += stamped
            next_offset += batch.records
        if not raw:
            continue
        first = struct.unpack_from(">q", raw, 0)[0]
        fetch_offset = data.draw(st.integers(first, next_offset - 1), label="fetch offset")
        aborted = data.draw(
            st.lists(st.tuples(st.sampled_from([producer_id, 7]), st.integers(first, next_offset))),
            label="aborted transactions",
        )
        for read_committed in (False, True):
            for include_headers in (False, True):
                decode_both(
                    bytes(raw),
                    fetch_offset,
                    partition=partition,
                    read_committed=read_committed,
                    aborted_transactions=aborted,
                    include_headers=include_headers,
                )


# --- hand-built batches --------------------------------------------------------------------

RecordSpec = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]
"""(offset delta, key, value, headers) of one record."""


def record_batch(
    base_offset: int,
    records: Sequence[RecordSpec],
    *,
    producer_id: int = -1,
    transactional: bool = False,
    control: bool = False,
    log_append_time_ms: int | None = None,
    last_offset_delta: int | None = None,
    compression: str = "none",
    leader_epoch: int = 5,
    timestamps_ms: Sequence[int] | None = None,
    base_timestamp_ms: int | None = None,
) -> bytes:
    """A record batch as a broker returns it, with the fields no producer sets itself
    (control bit, log-append time, a lastOffsetDelta past the records as compaction leaves
    it, a base timestamp that its deltas overflow) written into kafka-python's builder
    output, and the CRC computed again. ``timestamps_ms``: each record's CreateTime."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[compression],
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=2**31 - 1,
    )
    for index, (delta, key, value, headers) in enumerate(records):
        timestamp = TIMESTAMP_MS + 10 * delta if timestamps_ms is None else timestamps_ms[index]
        builder.append(delta, timestamp, key, value, headers)
    data = bytearray(builder.build())
    if base_timestamp_ms is not None:
        struct.pack_into(">q", data, 27, base_timestamp_ms)
    struct.pack_into(">qii", data, 0, base_offset, len(data) - 12, leader_epoch)
    attributes = struct.unpack_from(">h", data, 21)[0]
    attributes |= 0x10 if transactional else 0
    attributes |= 0x20 if control else 0
    if log_append_time_ms is not None:
        attributes |= 0x08
        struct.pack_into(">q", data, 35, log_append_time_ms)
    struct.pack_into(">h", data, 21, attributes)
    if last_offset_delta is not None:
        struct.pack_into(">i", data, 23, last_offset_delta)
    if producer_id >= 0:
        struct.pack_into(">qhi", data, 43, producer_id, 0, -1 if control else base_offset)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def plain(
    base_offset: int, values: Sequence[bytes], producer_id: int = -1, **options: Any
) -> bytes:
    """A batch of records with keys ``k<offset>``, the given values and one header each."""
    specs: list[RecordSpec] = [
        (delta, b"k%d" % (base_offset + delta), value, [("h", b"%d" % delta)])
        for delta, value in enumerate(values)
    ]
    return record_batch(base_offset, specs, producer_id=producer_id, **options)


def marker(offset: int, producer_id: int, *, commit: bool) -> bytes:
    """A transaction marker: a control batch with one record whose key is (version 0,
    type 1 commit / 0 abort) and whose value is (version 0, coordinator epoch 0)."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    return record_batch(
        offset,
        [(0, key, struct.pack(">hi", 0, 0), [])],
        producer_id=producer_id,
        transactional=True,
        control=True,
    )


def values_of(decoded: DecodedRecords) -> list[tuple[int, bytes | None]]:
    return list(
        zip(
            decoded.batch.column("offset").to_pylist(),
            decoded.batch.column("value").to_pylist(),
            strict=True,
        )
    )


TRANSACTIONS = b"".join(
    [
        plain(0, [b"a0", b"a1", b"a2"], producer_id=7, transactional=True),  # aborted
        plain(3, [b"p3", b"p4"]),
        plain(5, [b"c5", b"c6"], producer_id=8, transactional=True),  # committed
        marker(7, 7, commit=False),
        marker(8, 8, commit=True),
        plain(9, [b"b9"], producer_id=7, transactional=True, compression="gzip"),  # aborted
        plain(10, [b"i10"], producer_id=9),  # idempotent, not transactional
        marker(11, 7, commit=False),
        plain(12, [b"d12", b"d13"], producer_id=7, transactional=True),  # committed
        marker(14, 7, commit=True),
    ]
)
ABORTED = [(7, 0), (7, 9)]
EVERY_DATA_RECORD = [
    (0, b"a0"),
    (1, b"a1"),
    (2, b"a2"),
    (3, b"p3"),
    (4, b"p4"),
    (5, b"c5"),
    (6, b"c6"),
    (9, b"b9"),
    (10, b"i10"),
    (12, b"d12"),
    (13, b"d13"),
]


@pytest.mark.parametrize("include_headers", [False, True])
def test_control_batches_and_aborted_transactions(include_headers: bool) -> None:
    uncommitted = decode_both(
        TRANSACTIONS, 0, aborted_transactions=ABORTED, include_headers=include_headers
    )
    assert values_of(uncommitted) == EVERY_DATA_RECORD
    assert uncommitted.next_fetch_offset == 15
    assert uncommitted.leader_epoch == 5
    committed = decode_both(
        TRANSACTIONS,
        0,
        read_committed=True,
        aborted_transactions=ABORTED,
        include_headers=include_headers,
    )
    assert values_of(committed) == [
        (3, b"p3"),
        (4, b"p4"),
        (5, b"c5"),
        (6, b"c6"),
        (10, b"i10"),
        (12, b"d12"),
        (13, b"d13"),
    ]
    assert committed.next_fetch_offset == 15
    # Without the response's list nothing is known to be aborted (the markers only end it).
    assert values_of(decode_both(TRANSACTIONS, 0, read_committed=True)) == EVERY_DATA_RECORD
    # Only the first transaction of producer 7 listed: the second is read.
    only_first = decode_both(TRANSACTIONS, 0, read_committed=True, aborted_transactions=[(7, 0)])
    assert (9, b"b9") in values_of(only_first)
    assert (0, b"a0") not in values_of(only_first)


@pytest.mark.parametrize("fetch_offset", range(15))
def test_every_fetch_offset_of_the_transactions(fetch_offset: int) -> None:
    """A fetch offset inside a batch (the broker returns the whole batch), on a marker or
    an aborted record: the records at or after it, the same next offset."""
    for read_committed in (False, True):
        decoded = decode_both(
            TRANSACTIONS,
            fetch_offset,
            read_committed=read_committed,
            aborted_transactions=ABORTED,
        )
        assert all(offset >= fetch_offset for offset, _ in values_of(decoded))
        assert decoded.next_fetch_offset == 15


@pytest.mark.parametrize("cut", [1, 11, 16, 17, 40, 61, 70, -1])
def test_a_partial_batch_at_the_end_is_left_for_the_next_fetch(cut: int) -> None:
    complete = plain(0, [b"v0", b"v1"]) + plain(2, [b"v2"], compression="lz4")
    last = plain(3, [b"v3", b"v4", b"v5"], compression="zstd")
    decoded = decode_both(complete + last[:cut], 1)
    assert values_of(decoded) == [(1, b"v1"), (2, b"v2")]
    assert decoded.next_fetch_offset == 3
    alone = decode_both(last[:cut], 3)
    assert values_of(alone) == []
    assert alone.next_fetch_offset == 3


@pytest.mark.parametrize("compression", sorted(CODECS))
def test_a_compaction_gap_is_stepped_over(compression: str) -> None:
    """Compaction keeps a batch's base offset and lastOffsetDelta and removes records in
    between or at the end: offsets 10, 13, 14 remain of 10..19, then the next batch at 20."""
    compacted = record_batch(
        10,
        [(0, b"a", b"x", []), (3, b"b", None, []), (4, None, b"z", [("n", None)])],
        last_offset_delta=9,
        compression=compression,
    )
    emptied = record_batch(20, [], last_offset_delta=4)  # every record compacted away
    following = plain(25, [b"y"])
    for fetch_offset, expected in [
        (10, [(10, b"x"), (13, None), (14, b"z"), (25, b"y")]),
        (11, [(13, None), (14, b"z"), (25, b"y")]),
        (15, [(25, b"y")]),
        (22, [(25, b"y")]),
    ]:
        decoded = decode_both(compacted + emptied + following, fetch_offset)
        assert values_of(decoded) == expected
        assert decoded.next_fetch_offset == 26
    gap_at_end = decode_both(compacted, 12)
    assert values_of(gap_at_end) == [(13, None), (14, b"z")]
    assert gap_at_end.next_fetch_offset == 20


@pytest.mark.parametrize("compression", sorted(CODECS))
@pytest.mark.parametrize("where", ["records", "header"])
def test_a_crc_mismatch_raises_through_both_paths(compression: str, where: str) -> None:
    data = bytearray(
        plain(0, [b"value-%d" % index * 20 for index in range(20)], compression=compression)
    )
    data[-3 if where == "records" else 30] ^= 0x40
    for native in (True, False):
        with pytest.raises(CorruptRecordsError, match="crc"):
            record_batches.decode(
                bytes(data), 0, TOPIC, 0, read_committed=False, include_headers=True, native=native
            )


def test_a_crc_mismatch_in_a_later_batch_never_yields_its_records() -> None:
    """A corrupt batch after good ones. The paths differ only in when they raise: the
    native one at once; the reference (kafka-python, as the Java consumer) hands out the
    good batches' records first and raises at the next fetch, which starts at the corrupt
    batch. Neither returns a record of the corrupt batch or past it."""
    good = plain(0, [b"v0", b"v1"])
    corrupt = bytearray(plain(2, [b"v2"]))
    corrupt[-1] ^= 0x01
    after = plain(3, [b"v3"])
    raw = good + bytes(corrupt) + after
    options: dict[str, Any] = {"read_committed": False, "include_headers": True}
    with pytest.raises(CorruptRecordsError, match="offset 2 failed crc check"):
        record_batches.decode(raw, 0, TOPIC, 0, native=True, **options)
    reference = record_batches.decode(raw, 0, TOPIC, 0, native=False, **options)
    assert values_of(reference) == [(0, b"v0"), (1, b"v1")]
    assert reference.next_fetch_offset == 2
    for native in (True, False):
        with pytest.raises(CorruptRecordsError, match="offset 2 failed crc check"):
            record_batches.decode(bytes(corrupt) + after, 2, TOPIC, 0, native=native, **options)


def test_unchecked_crcs_read_the_records() -> None:
    data = bytearray(plain(0, [b"v0", b"v1"]))
    data[17] ^= 0xFF  # the stored CRC itself
    decoded = decode_both(bytes(data), 0, check_crcs=False)
    assert values_of(decoded) == [(0, b"v0"), (1, b"v1")]


@pytest.mark.parametrize("compression", ["none", "snappy"])
def test_log_append_time_gives_every_record_the_batch_time(compression: str) -> None:
    appended_ms = TIMESTAMP_MS + 123_456
    data = plain(0, [b"v0", b"v1", b"v2"], log_append_time_ms=appended_ms, compression=compression)
    data += plain(3, [b"v3"])
    decoded = decode_both(data, 0).batch.to_pylist()
    moment = datetime.datetime.fromtimestamp(appended_ms / 1000, datetime.timezone.utc)
    assert [(row["timestamp"], row["timestampType"]) for row in decoded] == [
        (moment, 1),
        (moment, 1),
        (moment, 1),
        (datetime.datetime.fromtimestamp(TIMESTAMP_MS / 1000, datetime.timezone.utc), 0),
    ]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_legacy_message_set_is_decoded_by_the_reference(compression: str) -> None:
    """Magic 1 (a broker may still return old data so): the native path hands it to the
    reference, whole, even after a v2 batch in the same response."""
    builder = LegacyRecordBatchBuilder(
        magic=1, compression_type=CODECS[compression], batch_size=2**31 - 1
    )
    for offset in range(4):
        builder.append(offset, TIMESTAMP_MS + offset, b"k%d" % offset, b"v%d" % offset)
    legacy = bytes(builder.build())
    decoded = decode_both(legacy, 1)
    assert values_of(decoded) == [(1, b"v1"), (2, b"v2"), (3, b"v3")]
    assert decoded.batch.column("key").to_pylist() == [b"k1", b"k2", b"k3"]
    assert decoded.next_fetch_offset == 4
    mixed = decode_both(legacy + plain(4, [b"v4"]), 0)
    assert values_of(mixed)[-2:] == [(3, b"v3"), (4, b"v4")]


@pytest.mark.parametrize("include_headers", [False, True])
def test_headers_null_values_unicode_keys_and_empty_records(include_headers: bool) -> None:
    records: list[RecordSpec] = [
        (0, None, None, []),
        (1, b"", b"", [("", b"")]),
        (2, b"\x00\xff", b"v", [("schlüssel", None), ("键", b"\x00"), ("schlüssel", b"2")]),
    ]
    for compression in sorted(CODECS):
        decoded = decode_both(
            record_batch(0, records, compression=compression), 0, include_headers=include_headers
        )
        rows = decoded.batch.to_pylist()
        assert [(row["key"], row["value"]) for row in rows] == [
            (None, None),
            (b"", b""),
            (b"\x00\xff", b"v"),
        ]
        if include_headers:
            assert [row["headers"] for row in rows] == [
                None,
                [{"key": "", "value": b""}],
                [
                    {"key": "schlüssel", "value": None},
                    {"key": "键", "value": b"\x00"},
                    {"key": "schlüssel", "value": b"2"},
                ],
            ]
        else:
            assert "headers" not in decoded.batch.schema.names


def test_a_record_with_a_null_header_key_is_corrupt_through_both_paths() -> None:
    """A header key is a non-null string in Kafka's format: the Java consumer and
    kafka-python refuse a record with length -1 there, rather than invent a key."""
    data = bytearray(record_batch(0, [(0, b"k", b"v", [("h", b"x")])]))
    key_at = data.index(b"\x02h", 61)  # the header key: varint length 1, then "h"
    data[key_at : key_at + 2] = b"\x01"  # length -1 (null), the key's byte gone
    data[61] -= 2  # the record's length varint: one byte shorter (zigzag: 2 per byte)
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    for native in (True, False):
        with pytest.raises(CorruptRecordsError, match="header key"):
            record_batches.decode(
                bytes(data), 0, TOPIC, 0, read_committed=False, include_headers=True, native=native
            )


def test_empty_data_decodes_to_no_rows() -> None:
    decoded = decode_both(b"", 42)
    assert decoded.batch.num_rows == 0
    assert decoded.next_fetch_offset == 42


# --- encode: refusals, producer state, partitioner ------------------------------------------


def test_a_header_with_a_null_key_is_refused_through_both_paths() -> None:
    """Kafka's header keys are non-null strings (the Java producer refuses a null one)."""
    rows = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"v"]),
            "headers": pa.array([[{"key": None, "value": b"x"}]], HEADERS),
        }
    )
    settings_ = EncodeSettings(1, 1 << 20, 1 << 20, "none", TIMESTAMP_MS)
    for native in (True, False):
        with pytest.raises(RecordRefusedError, match="header"):
            record_batches.encode(rows, settings_, 0, native=native)


@pytest.mark.parametrize("wanted", [-1, 3])
def test_a_partition_the_topic_lacks_is_refused_through_both_paths(wanted: int) -> None:
    rows = pa.RecordBatch.from_pydict(
        {"value": pa.array([b"v", b"w"]), "partition": pa.array([0, wanted], pa.int32())}
    )
    settings_ = EncodeSettings(3, 1 << 20, 1 << 20, "none", TIMESTAMP_MS)
    messages = set()
    for native in (True, False):
        with pytest.raises(RecordRefusedError) as refused:
            record_batches.encode(rows, settings_, 0, native=native)
        messages.add(str(refused.value))
    assert messages == {f"a row asks for partition {wanted}, but the topic has 3 partitions"}


@DIFFERENTIAL
@given(
    st.binary(min_size=61, max_size=61).map(lambda header: header[:16] + b"\x02" + header[17:]),
    st.binary(max_size=64),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**15 - 1),
    st.integers(0, 2**31 - 1),
    st.booleans(),
)
def test_set_producer_state_writes_the_same_bytes(
    header: bytes, records: bytes, producer_id: int, epoch: int, sequence: int, transactional: bool
) -> None:
    native = bytearray(header + records)
    reference = bytearray(native)
    record_batches.NATIVE.set_producer_state(native, producer_id, epoch, sequence, transactional)
    record_batches.reference_set_producer_state(
        reference, producer_id, epoch, sequence, transactional
    )
    assert native == reference
    assert struct.unpack_from(">qhi", native, 43) == (producer_id, epoch, sequence)
    assert struct.unpack_from(">I", native, 17)[0] == calc_crc32c(bytes(native[21:]))


@DIFFERENTIAL
@given(st.binary(max_size=64), st.integers(1, 1000))
def test_murmur2_partition_equals_kafka_pythons_default_partitioner(
    key: bytes, partitions: int
) -> None:
    assert record_batches.NATIVE.partition_for_key(key, partitions) == default_partition(
        key, partitions
    )


@pytest.mark.skipif(record_batches.NATIVE is None, reason="the native path is not built")
def test_a_header_key_that_is_not_utf8_reads_as_sparks_source_reads_it() -> None:
    """Spark's own source makes a Java String of the key bytes: malformed UTF-8 becomes
    U+FFFD. The native path does the same instead of failing the range on every retry."""
    rows = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"v"], pa.binary()),
            "headers": pa.array([[{"key": "hX", "value": b"1"}]], record_batches.HEADERS),
        }
    )
    settings = record_batches.EncodeSettings(1, 1 << 16, 1 << 20, "none", 1_700_000_000_000)
    (encoded,), _ = record_batches.encode(rows, settings, 0, native=True)
    data = bytearray(encoded.data)
    at = data.index(b"hX")
    data[at + 1] = 0xFF
    record_batches.reference_set_producer_state(data, -1, -1, -1, False)  # the CRC again
    decoded = record_batches.decode(
        bytes(data), 0, "t", 0, read_committed=True, include_headers=True, native=True
    )
    assert decoded.batch.column("headers").to_pylist() == [[{"key": "h\ufffd", "value": b"1"}]]


# --- broker-supplied numbers at and beyond what Spark can hold ------------------------------

MAX_MS = record_batches.MAX_TIMESTAMP_MILLIS
MIN_MS = record_batches.MIN_TIMESTAMP_MILLIS
LONG_MAX = 2**63 - 1


def timestamped(timestamps_ms: Sequence[int], **options: Any) -> bytes:
    """One batch of records 0..n-1 with the given CreateTimes (values ``v<offset>``)."""
    specs: list[RecordSpec] = [
        (delta, None, b"v%d" % delta, []) for delta in range(len(timestamps_ms))
    ]
    return record_batch(0, specs, timestamps_ms=timestamps_ms, **options)


def micros_of(decoded: DecodedRecords) -> list[int]:
    return decoded.batch.column("timestamp").cast(pa.int64()).to_pylist()


def test_timestamps_at_the_edges_of_sparks_range_read_exactly_through_both_paths() -> None:
    """Spark's own source reads these (its ``Math.multiplyExact`` does not overflow); most
    lie outside Python's datetime, so the columns are compared as microseconds."""
    edges = [MIN_MS, MIN_MS + 1, -62_135_596_800_001, -1, 0, 253_402_300_800_000, MAX_MS]
    for timestamp in edges:  # one batch each: a batch's deltas are relative to its first
        raw = timestamped([timestamp, timestamp])
        for native in (True, False):
            decoded = record_batches.decode(
                raw, 0, TOPIC, 0, read_committed=False, include_headers=True, native=native
            )
            assert micros_of(decoded) == [timestamp * 1000, timestamp * 1000]


BEYOND = [MAX_MS + 1, MIN_MS - 1, -(10**17), 2**62, LONG_MAX, -(2**63)]


def assert_out_of_range_through_both_paths(
    raw: bytes, fetch_offset: int, offset: int, millis: int
) -> None:
    """Both paths fail with the same one line naming the record and its value."""
    messages = []
    for native in (True, False):
        with pytest.raises(record_batches.TimestampOutOfRangeError) as raised:
            record_batches.decode(
                raw,
                fetch_offset,
                TOPIC,
                3,
                read_committed=False,
                include_headers=True,
                native=native,
            )
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert "\n" not in messages[0]
    assert f"Record {TOPIC}-3 at offset {offset} has timestamp {millis} ms" in messages[0]
    assert "fix the producer's timestamps" in messages[0]


@pytest.mark.parametrize("millis", BEYOND)
def test_a_create_time_beyond_sparks_range_fails_through_both_paths(millis: int) -> None:
    """Was read as a wrapped instant (CreateTime -1e17 ms as year -244134, 2**62 ms as
    1970-01-01) or, in a debug build, a panic."""
    assert_out_of_range_through_both_paths(timestamped([0, millis, 5]), 0, 1, millis)


@pytest.mark.parametrize("millis", [MAX_MS + 1, -(10**17)])
def test_a_log_append_time_beyond_sparks_range_fails_through_both_paths(millis: int) -> None:
    raw = timestamped([0, 1], log_append_time_ms=millis)
    assert_out_of_range_through_both_paths(raw, 0, 0, millis)


def test_a_timestamp_delta_that_overflows_a_long_fails_with_the_exact_sum() -> None:
    """base timestamp + delta beyond a long: the sum is named, not a wrapped value."""
    raw = timestamped([0, 10], base_timestamp_ms=LONG_MAX - 5)
    assert_out_of_range_through_both_paths(raw, 0, 0, LONG_MAX - 5)
    raw = timestamped([0, 10], base_timestamp_ms=MAX_MS - 5)
    assert_out_of_range_through_both_paths(raw, 0, 1, MAX_MS + 5)


def test_a_record_below_the_fetch_offset_is_not_checked() -> None:
    """So startingOffsets past a bad record reads on (as the error message advises)."""
    decoded = decode_both(timestamped([-(10**17), 7]), 1)
    assert micros_of(decoded) == [7000]
    assert values_of(decoded) == [(1, b"v1")]


def test_offsets_beyond_a_long_are_corrupt_through_both_paths() -> None:
    for base_offset, last_offset_delta in [(LONG_MAX - 1, 1), (LONG_MAX - 5, 9)]:
        raw = bytearray(timestamped([1, 2]))
        struct.pack_into(">q", raw, 0, base_offset)
        struct.pack_into(">i", raw, 23, last_offset_delta)
        struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
        for native in (True, False):
            with pytest.raises(CorruptRecordsError, match="largest offset"):
                record_batches.decode(
                    bytes(raw),
                    0,
                    TOPIC,
                    0,
                    read_committed=False,
                    include_headers=True,
                    native=native,
                )
