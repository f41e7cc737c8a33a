"""replayable-kafka without Spark or a broker: option parsing, every option error, and the
pure planning logic (offset JSON, rate limiting, range splitting, data loss, Arrow rows)."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from kafka.consumer.fetcher import ConsumerRecord

from eospack.connectors.kafka.errors import (
    KafkaDataLossError,
    KafkaReadTimeoutError,
    KafkaSourceOptionError,
)
from eospack.connectors.kafka.records.record_batches import records_to_arrow
from eospack.connectors.kafka.records.schema import spark_schema
from eospack.connectors.kafka.source.offset_format import offsets_from_json, offsets_to_json
from eospack.connectors.kafka.source.offset_ranges import (
    OffsetRange,
    available_records,
    pack_ranges,
    rate_limit,
    split_ranges,
)
from eospack.connectors.kafka.source.options import KafkaSourceOptions, parse_options
from eospack.connectors.kafka.source.planning import TriggerPacer, plan_ranges
from eospack.connectors.kafka.source.reader import _within

BASE = {"kafka.bootstrap.servers": "broker1:9092,broker2:9093", "subscribe": "orders"}


def parse(**extra: str) -> KafkaSourceOptions:
    # A plain dict: the options reader makes its names case-insensitive, as Spark's are.
    return parse_options({**BASE, **extra})


def parse_raw(options: dict[str, str]) -> KafkaSourceOptions:
    return parse_options(options)


def test_defaults_follow_sparks_kafka_source() -> None:
    options = parse()
    assert options.bootstrap_servers == "broker1:9092,broker2:9093"
    assert options.subscription.kind == "subscribe"
    assert options.subscription.topics == ("orders",)
    assert options.starting is None and options.ending is None
    assert options.fail_on_data_loss is True
    assert options.include_headers is False
    assert options.max_offsets_per_trigger is None
    assert options.max_trigger_delay_ms == 15 * 60 * 1000
    assert options.poll_timeout_ms == 120_000
    assert options.metadata_timeout_ms == 10_000


def test_option_names_are_case_insensitive_and_all_parsed() -> None:
    options = parse_raw(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "h:1",
            "subscribePattern": "orders_.*",
            "startingOffsets": '{"orders_a":{"0":23,"1":-2}}',
            "maxOffsetsPerTrigger": "1000",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
            "minPartitions": "8",
            "failOnDataLoss": "FALSE",
            "includeHeaders": "true",
            "kafkaConsumer.pollTimeoutMs": "5000",
        }
    )
    assert options.subscription.pattern == "orders_.*"
    assert options.starting is not None
    assert options.starting.kind == "offsets"
    assert options.starting.as_dict() == {("orders_a", 0): 23, ("orders_a", 1): -2}
    assert (options.max_offsets_per_trigger, options.min_offsets_per_trigger) == (1000, 10)
    assert options.max_trigger_delay_ms == 30_000
    assert options.min_partitions == 8
    assert options.fail_on_data_loss is False
    assert options.include_headers is True
    assert options.poll_timeout_ms == 5000


def test_assign_and_ending_offsets() -> None:
    options = parse_raw(
        {
            "kafka.bootstrap.servers": "h:1",
            "assign": '{"b":[1,0],"a":[0]}',
            "endingOffsets": '{"a":{"0":-1},"b":{"0":5,"1":7}}',
        }
    )
    assert options.subscription.partitions == (("a", 0), ("b", 0), ("b", 1))
    assert options.ending is not None
    assert options.ending.as_dict() == {("a", 0): -1, ("b", 0): 5, ("b", 1): 7}


def test_timestamp_options() -> None:
    options = parse(
        startingOffsetsByTimestamp='{"orders":{"0":1700000000000}}',
        startingOffsetsByTimestampStrategy="latest",
        endingTimestamp="1800000000000",
    )
    assert options.starting is not None and options.starting.kind == "timestamps"
    assert options.starting.timestamp_strategy == "latest"
    assert options.ending is not None and options.ending.timestamp == 1800000000000
    # startingTimestamp wins over startingOffsetsByTimestamp and startingOffsets, as in Spark.
    both = parse(startingOffsets="earliest", startingTimestamp="5")
    assert both.starting is not None and both.starting.kind == "timestamp"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"subscribe": "t"},
            "Option kafka.bootstrap.servers is required: set kafka.bootstrap.servers to"
            " host:port[,host:port...]",
        ),
        (
            {"kafka.bootstrap.servers": "localhost", "subscribe": "t"},
            "Option kafka.bootstrap.servers is 'localhost': use host:port[,host:port...]",
        ),
        (
            {"kafka.bootstrap.servers": "h:1"},
            "Set exactly one of the options subscribe, subscribePattern or assign (found none)",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "subscribePattern": "t.*"},
            "Set exactly one of the options subscribe, subscribePattern or assign"
            " (found subscribe and subscribePattern)",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": " , "},
            "Option subscribe is empty: set it to a comma-separated list of topics",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribePattern": "("},
            "Option subscribePattern is not a valid regular expression"
            " (missing ), unterminated subpattern at position 0)",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "assign": "{'t': [0]}"},
            "Option assign is not valid JSON (Expecting property name enclosed in double quotes"
            ' at char 1): use JSON like {"topic":[0,1]}',
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "assign": '{"t": "0"}'},
            "Option assign lists '0' for topic t: use a JSON list of partition numbers,"
            ' e.g. {"topic":[0,1]}',
        ),
    ],
)
def test_connection_and_subscription_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(KafkaSourceOptionError) as raised:
        parse_raw(options)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"startingOffsets": "{not json"},
            "Option startingOffsets is not valid JSON (Expecting property name enclosed in"
            " double quotes at char 1): use earliest, latest or JSON like"
            ' {"topic":{"0":23,"1":-2}}',
        ),
        (
            {"startingOffsets": "newest"},
            "Option startingOffsets is not valid JSON (Expecting value at char 0):"
            ' use earliest, latest or JSON like {"topic":{"0":23,"1":-2}}',
        ),
        (
            {"startingOffsets": '{"orders":{"0":-3}}'},
            "Option startingOffsets has -3 for orders-0: use an offset, -2 or -1",
        ),
        (
            {"startingOffsets": '{"orders":{"zero":5}}'},
            "Option startingOffsets has partition 'zero' for topic orders: partitions are"
            ' non-negative integers, e.g. {"topic":{"0":23,"1":-2}}',
        ),
        (
            {"startingOffsets": '{"orders":[0]}'},
            "Option startingOffsets maps topic orders to [0]: use earliest, latest or JSON like"
            ' {"topic":{"0":23,"1":-2}}',
        ),
        (
            {"endingOffsets": "earliest"},
            "Option endingOffsets cannot be earliest (-2): use latest, -1, or an offset",
        ),
        (
            {"endingOffsets": '{"orders":{"0":-2}}'},
            "Option endingOffsets cannot be earliest (-2): use latest, -1, or an offset",
        ),
        (
            {"startingTimestamp": "yesterday"},
            "Option startingTimestamp is 'yesterday': use a timestamp in epoch milliseconds",
        ),
        (
            {"startingOffsetsByTimestampStrategy": "closest"},
            "Option startingOffsetsByTimestampStrategy is 'closest': use error (default) or latest",
        ),
        (
            {"maxOffsetsPerTrigger": "-5"},
            "Option maxOffsetsPerTrigger is '-5': use a positive integer",
        ),
        (
            {"maxOffsetsPerTrigger": "lots"},
            "Option maxOffsetsPerTrigger is 'lots': use a positive integer",
        ),
        (
            {"minOffsetsPerTrigger": "0"},
            "Option minOffsetsPerTrigger is '0': use a positive integer",
        ),
        (
            {"minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"},
            "Option minOffsetsPerTrigger (50) exceeds maxOffsetsPerTrigger (10):"
            " lower minOffsetsPerTrigger or raise maxOffsetsPerTrigger",
        ),
        (
            {"maxTriggerDelay": "soon"},
            "Option maxTriggerDelay is 'soon': use a duration such as 500ms, 30s, 2min or 1h",
        ),
        ({"minPartitions": "1.5"}, "Option minPartitions is '1.5': use a positive integer"),
        ({"failOnDataLoss": "yes"}, "Option failOnDataLoss is 'yes': use true or false"),
        ({"includeHeaders": "1"}, "Option includeHeaders is '1': use true or false"),
    ],
)
def test_offset_and_limit_errors(extra: dict[str, str], message: str) -> None:
    with pytest.raises(KafkaSourceOptionError) as raised:
        parse(**extra)
    assert str(raised.value) == message


def test_duration_units() -> None:
    assert parse(maxTriggerDelay="250").max_trigger_delay_ms == 250
    assert parse(maxTriggerDelay="2min").max_trigger_delay_ms == 120_000
    assert parse(maxTriggerDelay="1h").max_trigger_delay_ms == 3_600_000


def test_kafka_options_map_to_kafka_python_keywords() -> None:
    options = parse(
        **{
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule"
            ' required username="alice" password="s3cr3t-pw";',
            "kafka.ssl.truststore.location": "/etc/ca.pem",
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.endpoint.identification.algorithm": "",
            "kafka.isolation.level": "read_committed",
            "kafka.client.id": "reporting",
            "kafka.request.timeout.ms": "4000",
            "kafka.max.partition.fetch.bytes": "1048576",
            "kafka.check.crcs": "false",
        }
    )
    config = options.consumer_config()
    assert config["security_protocol"] == "SASL_SSL"
    assert config["sasl_mechanism"] == "SCRAM-SHA-512"
    assert config["sasl_plain_username"] == "alice"
    assert config["sasl_plain_password"] == "s3cr3t-pw"
    assert config["ssl_cafile"] == "/etc/ca.pem"
    assert config["ssl_check_hostname"] is False
    assert config["isolation_level"] == "read_committed"
    assert config["client_id"] == "reporting"
    assert config["request_timeout_ms"] == 4000
    assert config["max_partition_fetch_bytes"] == 1048576
    assert config["check_crcs"] is False
    # The source owns offsets: no group, no commits, no silent offset reset.
    assert config["enable_auto_commit"] is False
    assert config["group_id"] is None
    assert config["auto_offset_reset"] == "none"
    assert config["bootstrap_servers"] == ["broker1:9092", "broker2:9093"]
    # The driver's metadata consumer is bounded by kafka.request.timeout.ms.
    metadata = options.metadata_consumer_config()
    assert metadata["request_timeout_ms"] == metadata["bootstrap_timeout_ms"] == 4000
    hash(options.consumer_cache_key())


def test_committed_records_only_and_no_topic_creation_by_default() -> None:
    config = parse().consumer_config()
    assert config["isolation_level"] == "read_committed"
    assert config["allow_auto_create_topics"] is False
    uncommitted = parse(**{"kafka.isolation.level": "READ_UNCOMMITTED"})
    assert uncommitted.consumer_config()["isolation_level"] == "read_uncommitted"
    assert uncommitted.metadata_consumer_config()["isolation_level"] == "read_uncommitted"


def test_secrets_never_appear_in_repr_or_errors() -> None:
    options = parse(
        **{
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule"
            " required username=bob password=hunter2-secret;",
            "kafka.ssl.key.password": "keypass-secret",
            "kafka.security.protocol": "SASL_SSL",
        }
    )
    assert "hunter2-secret" not in repr(options)
    assert "keypass-secret" not in repr(options)
    assert options.consumer_config()["sasl_plain_password"] == "hunter2-secret"
    assert options.consumer_config()["ssl_password"] == "keypass-secret"
    with pytest.raises(KafkaSourceOptionError) as raised:
        parse(**{"kafka.sasl.jaas.config": 'Krb5LoginModule required password="topsecret";'})
    assert "topsecret" not in str(raised.value)
    assert str(raised.value) == (
        "Option kafka.sasl.jaas.config must be a PlainLoginModule or ScramLoginModule entry"
        ' with username="..." password="...": for GSSAPI, set kafka.sasl.kerberos.service.name'
        " and give each process a Kerberos ticket (kinit, or KRB5_CLIENT_KTNAME naming a"
        " keytab) instead"
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "kafka.group.id",
            "g1",
            "Option kafka.group.id is not supported: this source uses no consumer group:"
            " offsets live in Spark's checkpoint (for lag tools, set"
            " commitOffsetsToGroup=<group id>)",
        ),
        (
            "kafka.auto.offset.reset",
            "earliest",
            "Option kafka.auto.offset.reset is not supported: set the source option"
            " startingOffsets instead",
        ),
        (
            "kafka.enable.auto.commit",
            "true",
            "Option kafka.enable.auto.commit is not supported: offsets live in Spark's"
            " checkpoint and are never committed to Kafka",
        ),
        (
            "kafka.value.deserializer",
            "org.apache.kafka.common.serialization.StringDeserializer",
            "Option kafka.value.deserializer is not supported: values are returned as binary:"
            " cast or parse the value column instead",
        ),
        (
            "kafka.linger.ms",
            "5",
            "Option kafka.linger.ms is not a consumer setting kafka-python supports: remove it"
            " (see the kafka.* table in docs/connectors/replayable-kafka.md)",
        ),
        (
            "kafka.fetch.max.wait.ms",
            "soon",
            "Option kafka.fetch.max.wait.ms is 'soon': use a non-negative integer",
        ),
        (
            "kafka.isolation.level",
            "read_everything",
            "Option kafka.isolation.level is 'read_everything': use read_committed (default)"
            " or read_uncommitted",
        ),
        (
            "kafka.ssl.truststore.location",
            "/etc/truststore.jks",
            "Option kafka.ssl.truststore.location needs a PEM file (kafka-python reads no"
            " JKS or PKCS12): convert it with keytool -exportcert -rfc -keystore"
            " truststore.jks -alias <ca> -file ca.pem, and set kafka.ssl.truststore.type=PEM",
        ),
    ],
)
def test_kafka_option_errors(name: str, value: str, message: str) -> None:
    extra = {name: value}
    if name == "kafka.ssl.truststore.location":
        extra["kafka.ssl.truststore.type"] = "JKS"
    with pytest.raises(KafkaSourceOptionError) as raised:
        parse(**extra)
    assert str(raised.value) == message


def test_offsets_json_round_trip_is_sorted_and_stable() -> None:
    offsets = {("b", 10): 5, ("a", 2): 7, ("b", 9): 0}
    as_json = offsets_to_json(offsets)
    assert list(as_json) == ["a", "b"]
    assert list(as_json["b"]) == ["9", "10"]
    assert as_json == {"a": {"2": 7}, "b": {"9": 0, "10": 5}}
    assert offsets_from_json(as_json) == offsets


def test_rate_limit_shares_the_limit_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 50}
    limited = rate_limit(90, start, latest, {("t", 2): 0})
    # backlogs 300, 100, 50 of 450: shares 60, 20, 10
    assert limited == {("t", 0): 60, ("t", 1): 120, ("t", 2): 10}
    assert available_records(start, latest, {("t", 2): 0}) == 450


def test_rate_limit_never_starves_or_overshoots() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 10_000, ("t", 1): 1}
    assert rate_limit(10, start, latest, {}) == {("t", 0): 9, ("t", 1): 1}
    # Nothing new, or a partition that went backwards: latest as is.
    assert rate_limit(10, {("t", 0): 5}, {("t", 0): 5}, {}) == {("t", 0): 5}
    assert rate_limit(10, {("t", 0): 9}, {("t", 0): 3}, {}) == {("t", 0): 3}


def test_split_ranges_follows_min_partitions() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 10, 10), OffsetRange("t", 2, 0, 20)]
    assert split_ranges(ranges, None) == [ranges[0], ranges[2]]
    assert split_ranges(ranges, 2) == [ranges[0], ranges[2]]
    split = split_ranges(ranges, 6)
    assert split == [
        OffsetRange("t", 0, 0, 20),
        OffsetRange("t", 0, 20, 40),
        OffsetRange("t", 0, 40, 60),
        OffsetRange("t", 0, 60, 80),
        OffsetRange("t", 0, 80, 100),
        OffsetRange("t", 2, 0, 20),
    ]


def test_small_ranges_share_a_partition_up_to_min_records() -> None:
    ranges = [
        OffsetRange("t", 0, 0, 600),
        OffsetRange("t", 1, 0, 500),
        OffsetRange("t", 2, 0, 1_000),
        OffsetRange("t", 3, 0, 400),
        OffsetRange("t", 4, 0, 300),
    ]
    assert pack_ranges(ranges, 1_000, None) == [
        (ranges[0],),  # 600 + 500 would exceed 1,000
        (ranges[2],),  # 1,000 or more: a partition of its own
        (ranges[1], ranges[3]),
        (ranges[4],),  # 500 + 400 + 300 would exceed it
    ]
    assert pack_ranges(ranges, 10_000, None) == [tuple(ranges)]


def test_packing_is_off_for_one_record_and_with_min_partitions() -> None:
    ranges = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 7, 9)]
    one_each = [(ranges[0],), (ranges[1],)]
    assert pack_ranges(ranges, 1, None) == one_each
    assert pack_ranges(ranges, 10_000, 2) == one_each


def test_min_records_per_partition_is_a_positive_integer() -> None:
    assert parse_options(BASE).min_records_per_partition == 10_000
    assert parse_options({**BASE, "minRecordsPerPartition": "1"}).min_records_per_partition == 1
    with pytest.raises(KafkaSourceOptionError, match="minRecordsPerPartition"):
        parse_options({**BASE, "minRecordsPerPartition": "0"})


def test_plan_ranges_new_partitions_start_at_earliest() -> None:
    asked: list[list[tuple[str, int]]] = []

    def earliest_of(tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        asked.append(tps)
        return {tp: 3 for tp in tps}

    ranges = plan_ranges({("t", 0): 5}, {("t", 0): 9, ("t", 1): 7}, earliest_of, True)
    assert ranges == [OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 3, 7)]
    assert asked == [[("t", 1)]]


def test_plan_ranges_data_loss_fails_naming_partition_offsets_and_option() -> None:
    with pytest.raises(KafkaDataLossError) as raised:
        plan_ranges({("t", 0): 50}, {("t", 0): 3}, lambda tps: dict.fromkeys(tps, 0), True)
    message = str(raised.value)
    assert "t-0" in message and "50" in message and "3" in message
    assert "failOnDataLoss=false" in message
    with pytest.raises(KafkaDataLossError) as gone:
        plan_ranges({("t", 0): 5, ("u", 1): 8}, {("t", 0): 6}, lambda tps: {}, True)
    assert "u-1 (at offset 8) are gone" in str(gone.value)


def test_plan_ranges_data_loss_tolerated_reads_from_earliest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        ranges = plan_ranges(
            {("t", 0): 50, ("gone", 0): 4},
            {("t", 0): 3},
            lambda tps: dict.fromkeys(tps, 0),
            False,
        )
    assert ranges == [OffsetRange("t", 0, 0, 3)]
    assert "failOnDataLoss=false" in caplog.text and "gone-0" in caplog.text


def test_trigger_pacer_waits_for_min_rows_until_the_delay() -> None:
    now = [0.0]
    pacer = TriggerPacer(max_delay_ms=1000, clock=lambda: now[0])
    assert not pacer.should_wait(available=1, min_rows=100)  # the first trigger runs
    now[0] = 0.5
    assert pacer.should_wait(available=1, min_rows=100)
    assert not pacer.should_wait(available=100, min_rows=100)
    now[0] = 0.9
    assert pacer.should_wait(available=5, min_rows=100)
    now[0] = 1.6
    assert not pacer.should_wait(available=5, min_rows=100)  # max delay passed


def _record(offset: int, key: bytes | None, headers: list) -> ConsumerRecord:
    return ConsumerRecord(
        "t", 3, 0, offset, 1_700_000_000_123, 1, key, b"v%d" % offset, headers, None, 1, 2, 0
    )


def test_records_become_one_arrow_batch_with_sparks_kafka_schema() -> None:
    records = [_record(7, b"k", [("h1", b"a"), ("h2", None)]), _record(9, None, [])]
    batch = records_to_arrow(records, "t", 3, include_headers=True)
    assert batch.to_pylist() == [
        {
            "key": b"k",
            "value": b"v7",
            "topic": "t",
            "partition": 3,
            "offset": 7,
            "timestamp": batch.column("timestamp")[0].as_py(),
            "timestampType": 1,
            "headers": [{"key": "h1", "value": b"a"}, {"key": "h2", "value": None}],
        },
        {
            "key": None,
            "value": b"v9",
            "topic": "t",
            "partition": 3,
            "offset": 9,
            "timestamp": batch.column("timestamp")[1].as_py(),
            "timestampType": 1,
            "headers": None,
        },
    ]
    assert batch.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert batch.column("timestamp")[0].value == 1_700_000_000_123_000
    plain = records_to_arrow(records, "t", 3, include_headers=False)
    assert plain.schema.names == [f.name for f in spark_schema(False).fields]


def test_within_keeps_only_the_half_open_range() -> None:
    batch = records_to_arrow([_record(o, None, []) for o in (3, 4, 6, 9, 10)], "t", 3, False)
    assert _within(batch, 4, 10).column("offset").to_pylist() == [4, 6, 9]
    assert _within(batch, 0, 100) is batch
    assert _within(batch, 11, 20).num_rows == 0


class FakePartitionLog:
    """One partition as a broker holds it: offsets [earliest, end), some without a record.

    ``out_of_range`` chooses the broker's answer to a fetch below ``earliest``: real Kafka
    raises OffsetOutOfRange, the embedded broker returns what it has from ``earliest``.
    """

    def __init__(
        self, earliest: int, end: int, gaps: set[int], out_of_range: bool, highwater: int = 0
    ) -> None:
        self.earliest, self.end, self.gaps = earliest, end, gaps
        self.out_of_range = out_of_range
        # Records up to ``end`` (the last stable offset) are readable, up to ``highwater`` exist.
        self.highwater_offset = max(highwater, end)
        self.next_offset = 0
        self.assigned: list = []

    def assign(self, tps: list) -> None:
        self.assigned = tps

    def seek(self, tp: object, offset: int) -> None:
        self.next_offset = offset

    def position(self, tp: object) -> int:
        return self.next_offset

    def poll(self, timeout_ms: int = 0) -> dict:
        from kafka.errors import OffsetOutOfRangeError

        if self.next_offset < self.earliest:
            if self.out_of_range:
                raise OffsetOutOfRangeError("out of range")
            self.next_offset = self.earliest
        upto = min(self.end, self.next_offset + 4)
        offsets = range(self.next_offset, upto)
        records = [_record(o, None, []) for o in offsets if o not in self.gaps]
        self.next_offset = upto
        batch = records_to_arrow(records, "t", 3, include_headers=False)
        return {self.assigned[0]: [batch]} if records else {}

    def beginning_offsets(self, tps: list, timeout_ms: int = 0) -> dict:
        return {tps[0]: self.earliest}

    def end_offsets(self, tps: list, timeout_ms: int = 0) -> dict:
        return {tps[0]: self.end}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {3}

    def highwater(self, tp: object) -> int:
        return self.highwater_offset


def read_fake(
    log: FakePartitionLog, offset_range: OffsetRange, fail: bool, **extra: str
) -> list[int]:
    from unittest import mock

    from kafka import KafkaConsumer

    from eospack.connectors.kafka.source.reader import _RangeReader

    # Only kafka-python's real consumer methods, with their real signatures.
    consumer = mock.create_autospec(KafkaConsumer, instance=True, spec_set=True)
    for name in ("assign", "seek", "poll", "position", "beginning_offsets", "end_offsets"):
        getattr(consumer, name).side_effect = getattr(log, name)
    consumer.partitions_for_topic.side_effect = log.partitions_for_topic
    consumer.highwater.side_effect = log.highwater
    options = parse(failOnDataLoss=str(fail).lower(), **extra)
    reader = _RangeReader(options, consumer, offset_range)
    return [o for batch in reader.batches() for o in batch.column("offset").to_pylist()]


def test_range_reader_reads_by_position_across_gaps() -> None:
    log = FakePartitionLog(earliest=0, end=20, gaps={5, 6, 11, 19}, out_of_range=True)
    expected = [o for o in range(4, 20) if o not in log.gaps]
    assert read_fake(log, OffsetRange("t", 3, 4, 20), fail=True) == expected
    # A range of nothing but a gap ends at once, with no rows.
    assert read_fake(log, OffsetRange("t", 3, 5, 7), fail=True) == []


@pytest.mark.parametrize("out_of_range", [True, False])
def test_range_reader_reports_offsets_lost_to_retention(
    out_of_range: bool, caplog: pytest.LogCaptureFixture
) -> None:
    log = FakePartitionLog(earliest=8, end=12, gaps=set(), out_of_range=out_of_range)
    with pytest.raises(KafkaDataLossError) as raised:
        read_fake(log, OffsetRange("t", 3, 2, 12), fail=True)
    assert str(raised.value).startswith(
        "Cannot read t-3 [2, 12): offsets from 2 to 8 of t-3 are gone (earliest available is 8)."
    )
    assert "failOnDataLoss=false" in str(raised.value)
    with caplog.at_level(logging.WARNING):
        assert read_fake(log, OffsetRange("t", 3, 2, 12), fail=False) == [8, 9, 10, 11]
    assert "skipped 6 offsets" in caplog.text


def test_a_range_beyond_the_last_stable_offset_waits_for_the_transaction(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from eospack.connectors.kafka.source import reader

    monkeypatch.setattr(reader, "_STALL_CHECK_MS", 0)
    # Planned up to 12 under read_uncommitted; a transaction open at 8 holds read_committed.
    log = FakePartitionLog(earliest=0, end=8, gaps=set(), out_of_range=True, highwater=12)
    with pytest.raises(KafkaReadTimeoutError) as raised:
        read_fake(
            log, OffsetRange("t", 3, 4, 12), fail=True, **{"kafkaConsumer.pollTimeoutMs": "50"}
        )
    assert str(raised.value) == (
        "Could not read t-3 [4, 12): stuck at offset 8 for 50 ms; a transaction open at that"
        " offset is not decided yet (read_committed), or raise kafkaConsumer.pollTimeoutMs"
    )
    # read_uncommitted never plans beyond the high watermark: a shorter partition is loss.
    log = FakePartitionLog(earliest=0, end=8, gaps=set(), out_of_range=True, highwater=8)
    with caplog.at_level(logging.WARNING):
        assert read_fake(log, OffsetRange("t", 3, 4, 12), fail=False) == [4, 5, 6, 7]
    assert "ends at offset 8 now" in caplog.text


def test_commit_offsets_to_group_is_parsed_and_a_blank_or_long_group_refused() -> None:
    assert parse().commit_offsets_to_group is None
    assert parse(commitOffsetsToGroup="orders-lag").commit_offsets_to_group == "orders-lag"
    assert parse(commitoffsetstogroup="orders-lag").commit_offsets_to_group == "orders-lag"
    assert parse(commitOffsetsToGroup="orders-lag").consumer_config()["group_id"] is None
    for bad in ("  ", "g" * 256):
        with pytest.raises(KafkaSourceOptionError, match="^Option commitOffsetsToGroup"):
            parse(commitOffsetsToGroup=bad)
