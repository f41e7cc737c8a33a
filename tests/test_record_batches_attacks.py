"""What an adversarial review of the two decode paths (native ``eospack._native`` and the
kafka-python reference) proved: record data on which they disagreed, on values, next fetch
offsets or the kind of error, and what they now both do (as the Java consumer, or stricter
where Java would silently read a cut value).

Agreement is judged as a task sees it: decode, then fetch again from the next fetch offset
until the data is exhausted or an error. The reference hands out the records before a bad
one and raises at the next fetch (kafka-python, like the Java consumer); the native path
raises at once. Both must end with the same rows, and the same kind of error.

Records are built byte by byte here (the fields no producer writes: varints beyond an int,
lengths that lie, control records without keys), with kafka-python's builder for the rest.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c

from eospack.connectors.kafka.errors import CorruptRecordsError, TimestampOutOfRangeError
from eospack.connectors.kafka.records import record_batches
from eospack.connectors.kafka.records.record_batches import CODECS, MAX_TIMESTAMP_MILLIS

_CHOSE_REFERENCE = os.environ.get("EOSPACK_NATIVE", "1").strip().lower() in (
    "0",
    "false",
    "no",
    "off",
)
if record_batches.NATIVE is None and (_CHOSE_REFERENCE or not os.environ.get("CI")):
    pytest.skip(f"needs the native path: {record_batches.active_path()}", allow_module_level=True)

TOPIC = "attacks"
TIMESTAMP_MS = 1_764_000_000_000

Row = tuple[int, bytes | None, bytes | None, int, int, Any]
"""offset, key, value, timestamp (microseconds), timestampType, headers."""


# --- building records and batches byte by byte -----------------------------------------------


def unsigned_varint(raw: int) -> bytes:
    """The varint bytes of an unsigned (already zigzagged) value, however large."""
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def varint(value: int) -> bytes:
    return unsigned_varint(zigzag(value))


def field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def record(
    offset_delta: int = 0,
    *,
    key: bytes | None = None,
    value: bytes | None = b"v",
    headers: Sequence[tuple[bytes | None, bytes | None]] = (),
    timestamp_delta: int = 0,
    raw_offset_delta: bytes | None = None,
    raw_timestamp_delta: bytes | None = None,
    raw_header_count: bytes | None = None,
    raw_key_length: bytes | None = None,
    length_change: int = 0,
    raw_length: bytes | None = None,
) -> bytes:
    """One record (format v2); the ``raw_*`` arguments replace a field's bytes as given."""
    body = b"\x00"  # attributes
    body += raw_timestamp_delta if raw_timestamp_delta is not None else varint(timestamp_delta)
    body += raw_offset_delta if raw_offset_delta is not None else varint(offset_delta)
    if raw_key_length is not None:
        body += raw_key_length + (key or b"")
    else:
        body += field(key)
    body += field(value)
    body += raw_header_count if raw_header_count is not None else varint(len(headers))
    for header_key, header_value in headers:
        body += field(header_key) + field(header_value)
    length = raw_length if raw_length is not None else varint(len(body) + length_change)
    return length + body


def batch(
    base_offset: int,
    records: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    producer_id: int = -1,
    transactional: bool = False,
    control: bool = False,
    base_timestamp: int = TIMESTAMP_MS,
    max_timestamp: int | None = None,
    log_append_time: bool = False,
) -> bytes:
    """A record batch (format v2) around ``records`` with a correct CRC."""
    attributes = (0x08 if log_append_time else 0) | (0x10 if transactional else 0)
    attributes |= 0x20 if control else 0
    body = struct.pack(
        ">hiqqqhii",
        attributes,
        count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp,
        base_timestamp if max_timestamp is None else max_timestamp,
        producer_id,
        0 if producer_id >= 0 else -1,
        -1,
        count,
    )
    body += records
    header = struct.pack(">qiib", base_offset, len(body) + 9, 5, 2)
    return header + struct.pack(">I", calc_crc32c(body)) + body


def built_batch(
    base_offset: int,
    values: Sequence[bytes],
    *,
    timestamps_ms: Sequence[int] | None = None,
    compression: str = "none",
    log_append_time_ms: int | None = None,
    producer_id: int = -1,
    transactional: bool = False,
) -> bytes:
    """A batch as kafka-python's builder writes it (any codec), fields patched after."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[compression],
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=2**31 - 1,
    )
    for delta, value in enumerate(values):
        timestamp = TIMESTAMP_MS if timestamps_ms is None else timestamps_ms[delta]
        builder.append(delta, timestamp, None, value, [])
    data = bytearray(builder.build())
    struct.pack_into(">qii", data, 0, base_offset, len(data) - 12, 5)
    attributes = struct.unpack_from(">h", data, 21)[0] | (0x10 if transactional else 0)
    if log_append_time_ms is not None:
        attributes |= 0x08
        struct.pack_into(">q", data, 35, log_append_time_ms)
    struct.pack_into(">h", data, 21, attributes)
    if producer_id >= 0:
        struct.pack_into(">qhi", data, 43, producer_id, 0, base_offset)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def marker(offset: int, producer_id: int, *, key: bytes | None, count: int = 1) -> bytes:
    records = record(key=key, value=struct.pack(">hi", 0, 0)) if count else b""
    return batch(
        offset,
        records,
        count,
        last_offset_delta=0,
        producer_id=producer_id,
        transactional=True,
        control=True,
    )


ABORT_KEY = struct.pack(">hh", 0, 0)
COMMIT_KEY = struct.pack(">hh", 0, 1)


# --- reading as a task does -------------------------------------------------------------------


def rows_of(decoded: record_batches.DecodedRecords) -> list[Row]:
    columns = decoded.batch.to_pydict()
    micros = decoded.batch.column("timestamp").cast(pa.int64()).to_pylist()
    return list(
        zip(
            columns["offset"],
            columns["key"],
            columns["value"],
            micros,
            columns["timestampType"],
            columns.get("headers", [None] * decoded.batch.num_rows),
            strict=True,
        )
    )


def read_on(
    raw: bytes, fetch_offset: int, *, native: bool, **options: Any
) -> tuple[list[Row], str | None, int]:
    """Rows, the kind of error that stopped the read (None: none), the last fetch offset."""
    options.setdefault("read_committed", False)
    options.setdefault("include_headers", True)
    rows: list[Row] = []
    for _ in range(50):
        try:
            decoded = record_batches.decode(raw, fetch_offset, TOPIC, 0, native=native, **options)
        except (CorruptRecordsError, TimestampOutOfRangeError) as error:
            return rows, type(error).__name__, fetch_offset
        rows += rows_of(decoded)
        if decoded.next_fetch_offset <= fetch_offset:
            return rows, None, decoded.next_fetch_offset
        fetch_offset = decoded.next_fetch_offset
    raise AssertionError("the read never ended")


def read_through_both_paths(
    raw: bytes, fetch_offset: int = 0, **options: Any
) -> tuple[list[Row], str | None, int]:
    """Both paths stop with the same kind of error (or none) and read the same rows, but
    for the rows the reference hands out before a bad record in the same fetch (the native
    path fails that fetch whole). Returns the native path's reading."""
    native = read_on(raw, fetch_offset, native=True, **options)
    reference = read_on(raw, fetch_offset, native=False, **options)
    assert native[1] == reference[1], (native, reference)
    if native[1] is None:
        assert native == reference
    else:
        assert reference[0][: len(native[0])] == native[0], (native, reference)
    return native


def assert_corrupt_through_both_paths(raw: bytes, fetch_offset: int = 0, **options: Any) -> None:
    for include_headers in (False, True):
        rows, error, _ = read_through_both_paths(
            raw, fetch_offset, include_headers=include_headers, **options
        )
        assert error == "CorruptRecordsError", rows


GOOD = record(0, value=b"good")


# --- varints beyond an int / a long ----------------------------------------------------------


@pytest.mark.parametrize(
    "raw_offset_delta",
    [varint(2**32 + 1), varint(-(2**32) + 1), unsigned_varint((1 << 33) | 2), varint(2**31)],
    ids=["2**32+1", "-2**32+1", "5-byte-wrapping-to-1", "2**31"],
)
def test_an_offset_delta_beyond_an_int_is_corrupt_not_another_offset(
    raw_offset_delta: bytes,
) -> None:
    """Was: the native path cut the varint to 32 bits and read offset 1 (a record that is
    not there, or a duplicate of offset 1), the reference read offset 4294967297."""
    raw = batch(0, GOOD + record(raw_offset_delta=raw_offset_delta), 2)
    assert_corrupt_through_both_paths(raw)


@pytest.mark.parametrize("tenth_byte", [0x02, 0x7F], ids=["bit-64-only", "every-high-bit"])
def test_a_timestamp_delta_beyond_a_long_is_corrupt_through_both_paths(tenth_byte: int) -> None:
    """A 10-byte varlong whose last byte holds more than bit 63. Was: the native path cut
    it and read CreateTime 1970-01-01T00:00:01.001 (or named a different overflowing
    value), the reference failed with TimestampOutOfRangeError naming ~5.9e20 ms."""
    raw_delta = unsigned_varint((tenth_byte << 63) | 2)
    assert len(raw_delta) == 10
    raw = batch(0, GOOD + record(1, raw_timestamp_delta=raw_delta), 2, base_timestamp=1000)
    assert_corrupt_through_both_paths(raw)


def test_a_ten_byte_varlong_within_a_long_still_reads() -> None:
    """The stricter varint reading refuses nothing a long holds: a delta of -2**63 + 1 with
    a base of 2**63 - 1 is CreateTime 0, whatever the varint's length."""
    raw_delta = varint(-(2**63) + 1)
    assert len(raw_delta) == 10
    raw = batch(0, record(raw_timestamp_delta=raw_delta), 1, base_timestamp=2**63 - 1)
    rows, error, _ = read_through_both_paths(raw)
    assert error is None
    assert [row[3] for row in rows] == [0]


@pytest.mark.parametrize("what", ["record-length", "key-length", "header-count"])
def test_a_length_beyond_an_int_is_corrupt_through_both_paths(what: str) -> None:
    """Was: the native path cut 2**32 + n to n and read the record (key b"k", one
    header...), the reference failed it."""
    if what == "record-length":
        body = record(key=b"k")
        length = len(body) - 1  # a one-byte length varint
        bad = unsigned_varint(zigzag(2**32 + length)) + body[1:]
    elif what == "key-length":
        bad = record(key=b"k", raw_key_length=varint(2**32 + 1))
    else:
        bad = record(headers=[(b"h", b"x")], raw_header_count=varint(2**32 + 1))
    assert_corrupt_through_both_paths(batch(0, GOOD + bad, 2))


# --- record structure the native path did not check ------------------------------------------


def test_a_negative_header_count_is_corrupt_through_both_paths() -> None:
    """Was: the native path read the record with no headers; kafka-python (and Java) refuse."""
    assert_corrupt_through_both_paths(batch(0, GOOD + record(1, raw_header_count=varint(-1)), 2))


@pytest.mark.parametrize("change", [1, 3, -1])
def test_a_record_length_that_lies_is_corrupt_through_both_paths(change: int) -> None:
    """A record whose length says more (or less) than its fields take. Was: the native path
    skipped the padding and read on; the reference and Java refuse ("Invalid record
    size")."""
    records = GOOD + record(1, length_change=change) + (b"\x00" * max(change, 0))
    records += record(2)
    assert_corrupt_through_both_paths(batch(0, records, 3))


def test_malformed_headers_are_corrupt_without_include_headers_too() -> None:
    """Was: without includeHeaders the native path never looked at headers and read the
    record; the reference (and Java) parse them always."""
    bad = record(1, headers=[(None, b"x")])
    assert_corrupt_through_both_paths(batch(0, GOOD + bad, 2))


def test_bytes_after_a_batchs_last_record_are_corrupt_through_both_paths() -> None:
    """A batch whose count says fewer records than it holds (or garbage after them). Was:
    the native path read the counted records and went on; the reference (and Java) refuse."""
    assert_corrupt_through_both_paths(batch(0, GOOD + record(1), 1) + built_batch(1, [b"next"]))
    assert_corrupt_through_both_paths(batch(0, GOOD + b"\x00\x00", 1))
    assert_corrupt_through_both_paths(batch(0, GOOD, -1, last_offset_delta=0))
    rows, error, _ = read_through_both_paths(batch(0, b"", -1, last_offset_delta=0))
    assert (rows, error) == ([], None)


@pytest.mark.parametrize("include_headers", [False, True])
def test_a_malformed_record_below_the_fetch_offset_is_corrupt_through_both_paths(
    include_headers: bool,
) -> None:
    """Records below the fetch offset are parsed (not timestamp-checked): the native path
    skipped their key, value and headers and read on; the reference refused the batch."""
    raw = batch(0, record(0, raw_header_count=varint(-1)) + record(1), 2)
    rows, error, _ = read_through_both_paths(raw, 1, include_headers=include_headers)
    assert (rows, error) == ([], "CorruptRecordsError")


# --- next fetch offsets -----------------------------------------------------------------------


def test_records_past_their_batchs_last_offset_give_the_same_next_fetch_offset() -> None:
    """Records whose offset deltas pass the batch's lastOffsetDelta. Was: the native path
    went on at 3, the reference at 1 (past the batch by its last offset, as Java)."""
    raw = batch(0, record(0) + record(1) + record(2), 3, last_offset_delta=0)
    for native in (True, False):
        decoded = record_batches.decode(
            raw, 0, TOPIC, 0, read_committed=False, include_headers=True, native=native
        )
        assert decoded.batch.column("offset").to_pylist() == [0, 1, 2]
        assert decoded.next_fetch_offset == 1


def test_data_wholly_below_the_fetch_offset_gives_the_same_next_fetch_offset() -> None:
    """Was: the native path kept the fetch offset (10), the reference went to the batch's
    end (2), as the Java consumer does."""
    raw = built_batch(0, [b"a", b"b"])
    for native in (True, False):
        decoded = record_batches.decode(
            raw, 10, TOPIC, 0, read_committed=False, include_headers=True, native=native
        )
        assert decoded.batch.num_rows == 0
        assert decoded.next_fetch_offset == 2


def test_a_record_offset_of_long_max_is_corrupt_through_both_paths() -> None:
    """A record at offset Long.MAX_VALUE (its batch's last offset below it): its next fetch
    offset is beyond a long. Was: the native path wrapped to Long.MIN_VALUE (a debug build
    panicked) and read on; the reference was not checked per record."""
    base = 2**63 - 11
    raw = batch(base, record(0) + record(10), 2, last_offset_delta=1)
    rows, error, _ = read_through_both_paths(raw, base)
    assert (rows, error) == ([], "CorruptRecordsError")


# --- control batches --------------------------------------------------------------------------


def transaction_then(control: bytes) -> bytes:
    """Producer 7's transactional record at 0, ``control`` at 1, a plain record at 2."""
    return (
        built_batch(0, [b"t0"], producer_id=7, transactional=True)
        + control
        + built_batch(2, [b"p2"])
    )


def test_an_empty_control_batch_is_no_marker_through_both_paths() -> None:
    """The log cleaner keeps an empty batch for a producer's state, control batches too.
    Was: the reference failed with RuntimeError('StopIteration raised unpacking
    messageset') under read_committed, not even a CorruptRecordsError; the native path (as
    Java) reads on."""
    raw = transaction_then(marker(1, 7, key=None, count=0))
    for aborted in ([], [(7, 0)]):
        rows, error, _ = read_through_both_paths(
            raw, read_committed=True, aborted_transactions=aborted
        )
        assert error is None
        assert [row[0] for row in rows] == ([2] if aborted else [0, 2])


@pytest.mark.parametrize(
    "key", [None, b"\x00\x00\x00", b"\xff\xff\x00\x00"], ids=["null", "3-bytes", "negative-version"]
)
def test_a_malformed_transaction_marker_is_corrupt_through_both_paths(key: bytes | None) -> None:
    """Java refuses a control record key shorter than 4 bytes or of negative version
    (InvalidRecordException). Was: the native path read it as a commit and read on, the
    reference failed with TypeError or struct.error."""
    raw = transaction_then(marker(1, 7, key=key))
    rows, error, _ = read_through_both_paths(raw, read_committed=True)
    assert (rows, error) == ([], "CorruptRecordsError")
    # Under read_uncommitted control batches are skipped unread, by both (and Java).
    rows, error, _ = read_through_both_paths(raw, read_committed=False)
    assert (error, [row[0] for row in rows]) == (None, [0, 2])


def test_a_longer_transaction_marker_key_is_read_as_java_reads_it() -> None:
    """A key of a later version may be longer than 4 bytes: Java reads its type from bytes
    2-3. Was: the reference failed with struct.error."""
    raw = transaction_then(marker(1, 7, key=ABORT_KEY + b"\x00\x01"))
    rows, error, _ = read_through_both_paths(
        raw, read_committed=True, aborted_transactions=[(7, 0)]
    )
    assert (error, [row[0] for row in rows]) == (None, [2])


# --- header keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header_key",
    [b"h\xff", b"\xe2\x82", b"\xf0\x80\x80\x80", b"\xed\xa0\x80x", b"ok\xc3"],
    ids=["ff", "truncated", "overlong", "surrogate", "cut-at-end"],
)
def test_a_header_key_of_malformed_utf8_reads_alike_through_both_paths(
    header_key: bytes,
) -> None:
    """Spark's source makes a Java String of the key (U+FFFD for malformed bytes). Was: the
    reference failed the read as corrupt, also without includeHeaders."""
    raw = batch(0, GOOD + record(1, headers=[(header_key, b"1")]), 2)
    for include_headers in (False, True):
        rows, error, _ = read_through_both_paths(raw, include_headers=include_headers)
        assert error is None
        assert len(rows) == 2
    rows, _, _ = read_through_both_paths(raw, include_headers=True)
    assert rows[1][5] == [{"key": header_key.decode("utf-8", "replace"), "value": b"1"}]


# --- timestamps: what held --------------------------------------------------------------------

BEYOND = MAX_TIMESTAMP_MILLIS + 1


@pytest.mark.parametrize("compression", sorted(CODECS))
def test_a_timestamp_beyond_sparks_range_in_a_compressed_batch_fails_alike(
    compression: str,
) -> None:
    raw = built_batch(
        0, [b"a", b"b", b"c"], timestamps_ms=[0, -(10**17), 5], compression=compression
    )
    rows, error, _ = read_through_both_paths(raw)
    assert (rows, error) == ([], "TimestampOutOfRangeError")
    rows, error, _ = read_through_both_paths(raw, 2)
    assert (error, [row[3] for row in rows]) == (None, [5000])


def test_a_log_append_time_beyond_range_is_not_checked_below_the_fetch_offset() -> None:
    raw = built_batch(0, [b"a", b"b"], log_append_time_ms=BEYOND) + built_batch(2, [b"c"])
    rows, error, _ = read_through_both_paths(raw, 2)
    assert (error, [row[0] for row in rows]) == (None, [2])
    rows, error, _ = read_through_both_paths(raw, 1)
    assert (rows, error) == ([], "TimestampOutOfRangeError")


def test_wild_timestamps_of_markers_and_aborted_records_under_read_committed() -> None:
    """A control batch is never returned, so never checked (as Java); an aborted record is
    skipped under read_committed, and fails the read under read_uncommitted."""
    raw = (
        built_batch(0, [b"t0"], producer_id=7, transactional=True, timestamps_ms=[BEYOND])
        + batch(
            1,
            record(key=ABORT_KEY, value=b"\x00\x00\x00\x00\x00\x00"),
            1,
            producer_id=7,
            transactional=True,
            control=True,
            base_timestamp=-(2**63),
            max_timestamp=2**63 - 1,
            log_append_time=True,
        )
        + built_batch(2, [b"p2"])
    )
    rows, error, _ = read_through_both_paths(
        raw, read_committed=True, aborted_transactions=[(7, 0)]
    )
    assert (error, [row[0] for row in rows]) == (None, [2])
    rows, error, _ = read_through_both_paths(raw, read_committed=False)
    assert (rows, error) == ([], "TimestampOutOfRangeError")
    rows, error, _ = read_through_both_paths(raw, 1, read_committed=False)
    assert (error, [row[0] for row in rows]) == (None, [2])


def test_a_bad_timestamp_before_a_corrupt_batch_fails_as_a_timestamp_through_both_paths() -> None:
    """The native path stops at the record; the reference reads on to the corrupt batch,
    hands out what came before, and its timestamp check fails first."""
    corrupt = bytearray(built_batch(2, [b"c"]))
    corrupt[-1] ^= 0x01
    raw = built_batch(0, [b"a", b"b"], timestamps_ms=[0, BEYOND]) + bytes(corrupt)
    rows, error, _ = read_through_both_paths(raw)
    assert (rows, error) == ([], "TimestampOutOfRangeError")
    beyond_long = bytearray(batch(2, record(0), 1, last_offset_delta=2**31 - 1))
    struct.pack_into(">q", beyond_long, 0, 2**63 - 2**30)
    struct.pack_into(">I", beyond_long, 17, calc_crc32c(bytes(beyond_long[21:])))
    raw = built_batch(0, [b"a", b"b"], timestamps_ms=[0, BEYOND]) + bytes(beyond_long)
    rows, error, _ = read_through_both_paths(raw)
    assert (rows, error) == ([], "TimestampOutOfRangeError")


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_legacy_message_set_beyond_sparks_range_fails_as_v2_does(compression: str) -> None:
    builder = LegacyRecordBatchBuilder(
        magic=1, compression_type=CODECS[compression], batch_size=2**31 - 1
    )
    for offset, timestamp in enumerate([TIMESTAMP_MS, BEYOND, TIMESTAMP_MS]):
        builder.append(offset, timestamp, None, b"v%d" % offset)
    raw = bytes(builder.build())
    rows, error, _ = read_through_both_paths(raw)
    assert (rows, error) == ([], "TimestampOutOfRangeError")
    rows, error, _ = read_through_both_paths(raw, 2)
    assert (error, [row[0] for row in rows]) == (None, [2])


def test_a_magic_0_message_has_the_time_and_type_sparks_source_reads() -> None:
    """Magic 0 carries no timestamp: the Java consumer reads NO_TIMESTAMP (-1 ms) and
    NO_TIMESTAMP_TYPE (-1), which Spark's source returns. Was: null and null."""
    builder = LegacyRecordBatchBuilder(magic=0, compression_type=0, batch_size=2**31 - 1)
    builder.append(0, None, b"k", b"v")
    rows, error, _ = read_through_both_paths(bytes(builder.build()))
    assert error is None
    assert [(row[0], row[3], row[4]) for row in rows] == [(0, -1000, -1)]


# --- compressed payloads that fail to decompress ----------------------------------------------


def compressed_batch(payload: bytes, codec: str, count: int) -> bytes:
    """A batch whose records are ``payload`` as given (already compressed), CRC correct."""
    body = struct.pack(
        ">hiqqqhii", CODECS[codec], count - 1, TIMESTAMP_MS, TIMESTAMP_MS, -1, -1, -1, count
    )
    body += payload
    header = struct.pack(">qiib", 0, len(body) + 9, 5, 2)
    return header + struct.pack(">I", calc_crc32c(body)) + body


def xerial(*blocks: bytes) -> bytes:
    import snappy

    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for block in blocks:
        compressed = snappy.compress(block)
        framed += struct.pack(">i", len(compressed)) + compressed
    return framed


def compressed_payloads() -> dict[str, tuple[bytes, str]]:
    import gzip

    import zstandard

    records = record(0) + record(1)
    return {
        "gzip-trailing-garbage": (gzip.compress(records) + b"\x00\x01", "gzip"),
        "gzip-not-gzip": (b"\x00" * 20, "gzip"),
        "zstd-trailing-garbage": (
            zstandard.ZstdCompressor().compress(records) + b"\x00\x01",
            "zstd",
        ),
        "zstd-not-zstd": (b"\x00" * 20, "zstd"),
        "xerial-trailing-bytes": (xerial(records) + b"\x00\x00", "snappy"),
        "xerial-block-cut": (xerial(records)[:-3], "snappy"),
        "lz4-not-lz4": (b"\x00" * 20, "lz4"),
    }


@pytest.mark.parametrize("case", sorted(compressed_payloads()))
def test_a_payload_that_fails_to_decompress_is_corrupt_through_both_paths(case: str) -> None:
    """Data that passes its CRC (a producer wrote it so, or kafka.check.crcs=false). Was:
    the reference raised the codec library's own error (BadGzipFile, ZstdError,
    struct.error...), which the reader does not take for corrupt data and which names no
    topic-partition or offset; the native path read trailing bytes after xerial blocks."""
    payload, codec = compressed_payloads()[case]
    assert_corrupt_through_both_paths(compressed_batch(payload, codec, 2))
