"""Options of ``format("replayable-kafka")``, parsed once into a frozen, typed object.

The option names and meanings are those of Spark's built-in Kafka source, so a query moves
over by changing the format name. Options are read through ``eospack.core.options.OptionReader``
(case-insensitive names, one grammar per kind of value). ``kafka.*`` options go to
kafka-python with Kafka's dotted names mapped to its keyword names; consumer settings that
would let kafka-python own offsets (group commits, offset reset, deserializers) are refused,
because this source keeps its offsets in Spark's offset log. Every error is one line naming
the option and the fix; values of secret options never appear in errors or reprs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from eospack.core.options import OptionReader

from ..client.config import kafka_client_params, kafka_value
from ..errors import KafkaSourceOptionError

EARLIEST = -2
LATEST = -1
# startingOffsets JSON key (never a topic name: Kafka's have no "@"): where unlisted
# partitions start; RestoredCheckpoint says "earliest", as for partitions discovered later.
UNLISTED = "@unlisted"
LONG_MAX = 2**63 - 1
"""Offsets and timestamps are longs in Kafka's requests (and Spark's options): beyond, a
value is refused here, not left to fail a request with ``struct.error``."""
INT_MAX = 2**31 - 1

TopicPartitionKey = tuple[str, int]

# Kafka consumer settings this source owns or cannot honour, with the fix to offer.
_REFUSED_KAFKA_OPTIONS = {
    "group.id": "this source uses no consumer group: offsets live in Spark's checkpoint"
    " (for lag tools, set commitOffsetsToGroup=<group id>)",
    "auto.offset.reset": "set the source option startingOffsets instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint and are never committed to Kafka",
    "key.deserializer": "keys are returned as binary: cast or parse the key column instead",
    "value.deserializer": "values are returned as binary: cast or parse the value column instead",
    "interceptor.classes": "consumer interceptors are not supported",
}

# Fetch sizes that favour throughput; a user's kafka.* value wins. A task reads offsets
# that exist, so the broker need not hold a fetch for new data: kafka-python keeps one
# fetch in flight per broker, and the one it sends past a range's end (the partition's end
# in a live stream) delayed the next range of a task by the whole wait (100 ms each).
_THROUGHPUT_DEFAULTS: dict[str, Any] = {
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
    "fetch_max_bytes": 64 * 1024 * 1024,
    "max_poll_records": 5_000,
    "fetch_max_wait_ms": 5,
}
# Broker failures (issue 37): kafka-python waits up to 30 s between attempts to reconnect
# to a node (reconnect_backoff_max_ms 30000; Java's client: 1000), so a read whose broker
# was SIGKILLed and restarted within seconds sat waiting for its next attempt long after the
# broker was back. 1 s as Java's client; a user's kafka.reconnect.backoff.max.ms wins.
_RECONNECT_DEFAULTS: dict[str, Any] = {"reconnect_backoff_max_ms": 1_000}
# Transactions: read only committed records, so a batch ends at the last stable offset and a
# replay returns the same rows whatever happens to a transaction later. A user's
# kafka.isolation.level=read_uncommitted wins (Spark's own source defaults to it).
DEFAULT_ISOLATION_LEVEL = "read_committed"
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
DEFAULT_METADATA_TIMEOUT_MS = 10_000
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
# A Python read task costs Spark 50-80 ms whatever it reads; 10,000 records take ~5 ms to
# read and about as long to write with a 2PC sink, so smaller ranges share a task.
DEFAULT_MIN_RECORDS_PER_PARTITION = 10_000

_SUBSCRIPTION_OPTIONS = ("subscribe", "subscribePattern", "assign")
_SERVERS = "host:port[,host:port...]"


@dataclass(frozen=True)
class Subscription:
    """Which topic-partitions to read: a topic list, a regex, or fixed partitions."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    partitions: tuple[TopicPartitionKey, ...] = ()

    def covers(self, tp: TopicPartitionKey) -> bool:
        """Whether this subscription reads ``tp`` (if it exists)."""
        if self.kind == "subscribe":
            return tp[0] in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern or "", tp[0]) is not None
        return tp in self.partitions

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return f"assign={assign_json(self.partitions)}"


@dataclass(frozen=True)
class OffsetBound:
    """Where reading starts or ends.

    ``kind`` is earliest, latest, offsets (``per_partition`` holds offsets, -2 earliest,
    -1 latest), timestamps (``per_partition`` holds epoch milliseconds) or timestamp (one
    ``timestamp`` for every partition). ``option`` names the option it came from.
    """

    kind: Literal["earliest", "latest", "offsets", "timestamps", "timestamp"]
    option: str
    per_partition: tuple[tuple[TopicPartitionKey, int], ...] = ()
    timestamp: int | None = None
    # What to do when no record is at or after a timestamp: "error" or "latest".
    timestamp_strategy: Literal["error", "latest"] = "error"
    # Where partitions an offsets JSON leaves out start ("@unlisted": "earliest" or "latest").
    unlisted: int = LATEST

    def as_dict(self) -> dict[TopicPartitionKey, int]:
        return dict(self.per_partition)


@dataclass(frozen=True)
class KafkaSourceOptions:
    """Every option of the source, validated. Build it with :func:`parse_options`."""

    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetBound | None
    ending: OffsetBound | None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    min_records_per_partition: int = DEFAULT_MIN_RECORDS_PER_PARTITION
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    metadata_timeout_ms: int = DEFAULT_METADATA_TIMEOUT_MS
    # commitOffsetsToGroup: the consumer group that gets a copy of each committed batch's end
    # offsets, for lag tools (``client.group_offsets``); never read back.
    commit_offsets_to_group: str | None = None
    # The ``query`` label of the source's metrics: option queryName, else the subscription.
    metrics_query: str = ""
    # kafka-python keyword arguments from kafka.* options (may hold secrets).
    kafka_params: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def consumer_config(self) -> dict[str, Any]:
        """kafka-python settings for a consumer that owns no offsets and joins no group."""
        config: dict[str, Any] = {**_THROUGHPUT_DEFAULTS, **_RECONNECT_DEFAULTS}
        config["isolation_level"] = DEFAULT_ISOLATION_LEVEL
        # An executor's consumer bootstraps within the read's deadline (a task that starts
        # while every broker is down waits for one as long as a read waits for records).
        config["bootstrap_timeout_ms"] = self.poll_timeout_ms
        # A source never creates the topics it reads (a deleted topic stays deleted).
        config["allow_auto_create_topics"] = False
        config.update(self.kafka_params)
        config.update(
            bootstrap_servers=self.bootstrap_servers.split(","),
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="none",
        )
        return config

    def metadata_consumer_config(self) -> dict[str, Any]:
        """Settings for the driver's consumer: bounded bootstrap and request times."""
        config = self.consumer_config()
        config["request_timeout_ms"] = self.metadata_timeout_ms
        config["bootstrap_timeout_ms"] = self.metadata_timeout_ms
        return config

    def consumer_cache_key(self) -> tuple[tuple[str, Any], ...]:
        """Hashable identity of the executor consumer settings (secrets included, never shown)."""
        return tuple(sorted((k, _hashable(v)) for k, v in self.consumer_config().items()))


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def assign_json(partitions: tuple[TopicPartitionKey, ...]) -> str:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return json.dumps(by_topic, separators=(",", ":"))


def parse_options(raw: Mapping[str, str]) -> KafkaSourceOptions:
    """Validate Spark's options for this source; raise KafkaSourceOptionError on bad input."""
    options = OptionReader(raw, KafkaSourceOptionError)
    bootstrap = options.required("kafka.bootstrap.servers", _SERVERS)
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    for server in servers:
        if not re.fullmatch(r"\[?[^\s\[\]]+\]?:\d+", server):
            raise options.refuse("kafka.bootstrap.servers", _SERVERS)
    max_offsets = options.positive_int("maxOffsetsPerTrigger", None)
    min_offsets = options.positive_int("minOffsetsPerTrigger", None)
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise KafkaSourceOptionError(
            f"Option minOffsetsPerTrigger ({min_offsets}) exceeds maxOffsetsPerTrigger"
            f" ({max_offsets}): lower minOffsetsPerTrigger or raise maxOffsetsPerTrigger"
        )
    kafka_options = dict(options.with_prefix("kafka."))
    kafka_options.pop("bootstrap.servers", None)
    subscription = _subscription(options)
    return KafkaSourceOptions(
        bootstrap_servers=",".join(servers),
        subscription=subscription,
        starting=_starting_bound(options),
        ending=_ending_bound(options),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=options.duration_ms("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=options.positive_int("minPartitions", None),
        min_records_per_partition=options.positive_int(
            "minRecordsPerPartition", DEFAULT_MIN_RECORDS_PER_PARTITION
        ),
        fail_on_data_loss=options.boolean("failOnDataLoss", True),
        include_headers=options.boolean("includeHeaders", False),
        poll_timeout_ms=options.positive_int(
            "kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS
        ),
        metadata_timeout_ms=_metadata_timeout(kafka_options),
        commit_offsets_to_group=_group_id(options),
        metrics_query=options.text("queryName") or subscription.describe(),
        kafka_params=_kafka_params(options, kafka_options),
    )


def _group_id(options: OptionReader) -> str | None:
    fix = "a consumer group id of its own (1 to 255 characters) that no running consumer uses"
    value = options.identity("commitOffsetsToGroup", fix)
    if value is not None and len(value) > 255:
        raise options.refuse("commitOffsetsToGroup", fix)
    return value


def _subscription(options: OptionReader) -> Subscription:
    given = [name for name in _SUBSCRIPTION_OPTIONS if options.text(name) is not None]
    if len(given) != 1:
        found = "none" if not given else " and ".join(given)
        raise KafkaSourceOptionError(
            f"Set exactly one of the options subscribe, subscribePattern or assign (found {found})"
        )
    kind = given[0]
    value = options.text(kind) or ""
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise KafkaSourceOptionError(
                "Option subscribe is empty: set it to a comma-separated list of topics"
            )
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        try:
            re.compile(value)
        except re.error as error:
            raise KafkaSourceOptionError(
                f"Option subscribePattern is not a valid regular expression ({error})"
            ) from None
        return Subscription("subscribePattern", pattern=value)
    parsed = _json_object(value, "assign", '{"topic":[0,1]}')
    partitions: list[TopicPartitionKey] = []
    for topic, numbers in parsed.items():
        if not isinstance(numbers, list) or not all(
            _is_int(n) and 0 <= n <= INT_MAX for n in numbers
        ):
            raise KafkaSourceOptionError(
                f"Option assign lists {numbers!r} for topic {topic}: use a JSON list of"
                ' partition numbers, e.g. {"topic":[0,1]}'
            )
        partitions.extend((topic, int(n)) for n in numbers)
    if not partitions:
        raise KafkaSourceOptionError('Option assign names no partition: use e.g. {"topic":[0,1]}')
    return Subscription("assign", partitions=tuple(sorted(set(partitions))))


def _starting_bound(options: OptionReader) -> OffsetBound | None:
    strategy = options.choice("startingOffsetsByTimestampStrategy", ("error", "latest"), "error")
    if options.text("startingTimestamp") is not None:
        return OffsetBound(
            "timestamp",
            "startingTimestamp",
            timestamp=_timestamp(options, "startingTimestamp"),
            timestamp_strategy=strategy,  # type: ignore[arg-type]
        )
    if options.text("startingOffsetsByTimestamp") is not None:
        return OffsetBound(
            "timestamps",
            "startingOffsetsByTimestamp",
            per_partition=_partition_json(options, "startingOffsetsByTimestamp", timestamps=True),
            timestamp_strategy=strategy,  # type: ignore[arg-type]
        )
    if options.text("startingOffsets") is not None:
        return _offsets_bound(options, "startingOffsets")
    return None


def _ending_bound(options: OptionReader) -> OffsetBound | None:
    if options.text("endingTimestamp") is not None:
        return OffsetBound(
            "timestamp", "endingTimestamp", timestamp=_timestamp(options, "endingTimestamp")
        )
    if options.text("endingOffsetsByTimestamp") is not None:
        return OffsetBound(
            "timestamps",
            "endingOffsetsByTimestamp",
            per_partition=_partition_json(options, "endingOffsetsByTimestamp", timestamps=True),
        )
    if options.text("endingOffsets") is not None:
        bound = _offsets_bound(options, "endingOffsets")
        if bound.kind == "earliest" or EARLIEST in bound.as_dict().values():
            raise KafkaSourceOptionError(
                "Option endingOffsets cannot be earliest (-2): use latest, -1, or an offset"
            )
        return bound
    return None


def _offsets_bound(options: OptionReader, name: str) -> OffsetBound:
    value = options.text(name) or ""
    if value.lower() in ("earliest", "latest"):
        return OffsetBound(value.lower(), name)  # type: ignore[arg-type]
    skip = (UNLISTED,) if name == "startingOffsets" else ()
    per_partition = _partition_json(options, name, skip=skip)
    choice = json.loads(value).get(UNLISTED) if skip else None
    if choice not in (None, "earliest", "latest"):
        raise KafkaSourceOptionError(
            f'Option startingOffsets has "{UNLISTED}": {choice!r}: use "earliest" or "latest"'
        )
    unlisted = EARLIEST if choice == "earliest" else LATEST
    return OffsetBound("offsets", name, per_partition=per_partition, unlisted=unlisted)


def _partition_json(
    options: OptionReader, name: str, timestamps: bool = False, skip: tuple[str, ...] = ()
) -> tuple[tuple[TopicPartitionKey, int], ...]:
    example = '{"topic":{"0":1700000000000}}' if timestamps else '{"topic":{"0":23,"1":-2}}'
    accepted = "earliest, latest or JSON like " if not timestamps else "JSON like "
    value = options.text(name) or ""
    parsed = _json_object(value, name, example, accepted)
    result: list[tuple[TopicPartitionKey, int]] = []
    for topic, partitions in parsed.items():
        if topic in skip:
            continue
        if not isinstance(partitions, dict) or not partitions:
            raise KafkaSourceOptionError(
                f"Option {name} maps topic {topic} to {partitions!r}: use {accepted}{example}"
            )
        for partition, number in partitions.items():
            if not str(partition).isdigit() or int(partition) > INT_MAX:
                raise KafkaSourceOptionError(
                    f"Option {name} has partition {partition!r} for topic {topic}:"
                    f" partitions are non-negative integers, e.g. {example}"
                )
            lowest = 0 if timestamps else EARLIEST
            if not _is_int(number) or not lowest <= number <= LONG_MAX:
                what = "a timestamp in epoch milliseconds" if timestamps else "an offset, -2 or -1"
                raise KafkaSourceOptionError(
                    f"Option {name} has {number!r} for {topic}-{partition}: use {what}"
                )
            result.append(((topic, int(partition)), int(number)))
    return tuple(sorted(result))


def _json_object(value: str, name: str, example: str, accepted: str = "JSON like ") -> dict:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise KafkaSourceOptionError(
            f"Option {name} is not valid JSON ({error.msg} at char {error.pos}):"
            f" use {accepted}{example}"
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise KafkaSourceOptionError(
            f"Option {name} must be a JSON object: use {accepted}{example}"
        )
    return parsed


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _timestamp(options: OptionReader, name: str) -> int:
    value = options.text(name) or ""
    if not value.isdigit() or int(value) > LONG_MAX:
        raise options.refuse(name, "a timestamp in epoch milliseconds")
    return int(value)


def _metadata_timeout(kafka_options: Mapping[str, str]) -> int:
    value = kafka_options.get("request.timeout.ms")
    if value is None:
        return DEFAULT_METADATA_TIMEOUT_MS
    return kafka_value(
        "request.timeout.ms", "request_timeout_ms", value, "consumer", KafkaSourceOptionError
    )


def _kafka_params(
    options: OptionReader, kafka_options: Mapping[str, str]
) -> tuple[tuple[str, Any], ...]:
    """kafka-python keywords of the ``kafka.*`` options (without ``bootstrap.servers``)."""
    raw = dict(kafka_options)
    raw.pop("isolation.level", None)
    params: dict[str, Any] = {
        "isolation_level": options.choice(
            "kafka.isolation.level", ISOLATION_LEVELS, DEFAULT_ISOLATION_LEVEL
        )
    }
    refused = _REFUSED_KAFKA_OPTIONS
    error = KafkaSourceOptionError
    params.update(kafka_client_params(raw, "consumer", refused, error, "replayable-kafka"))
    return tuple(sorted(params.items()))
