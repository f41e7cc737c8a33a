"""Options of ``format("replayable-kafka")``, parsed once into a frozen, typed object.

The option names and meanings are those of Spark's built-in Kafka source, so a query moves
over by changing the format name. Spark hands options to Python data sources with
lower-cased keys, so every lookup here is case-insensitive. ``kafka.*`` options go to
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

from eospack.connectors.kafka.client_config import kafka_client_params, kafka_value
from eospack.connectors.kafka.errors import KafkaSourceOptionError

EARLIEST = -2
LATEST = -1

TopicPartitionKey = tuple[str, int]

# Kafka consumer settings this source owns or cannot honour, with the fix to offer.
_REFUSED_KAFKA_OPTIONS = {
    "group.id": "this source uses no consumer group: offsets live in Spark's checkpoint",
    "auto.offset.reset": "set the source option startingOffsets instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint and are never committed to Kafka",
    "key.deserializer": "keys are returned as binary: cast or parse the key column instead",
    "value.deserializer": "values are returned as binary: cast or parse the value column instead",
    "interceptor.classes": "consumer interceptors are not supported",
}

# Fetch sizes that favour throughput; a user's kafka.* value wins.
_THROUGHPUT_DEFAULTS: dict[str, Any] = {
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
    "fetch_max_bytes": 64 * 1024 * 1024,
    "max_poll_records": 5_000,
    "fetch_max_wait_ms": 100,
}
# Transactions: read only committed records, so a batch ends at the last stable offset and a
# replay returns the same rows whatever happens to a transaction later. A user's
# kafka.isolation.level=read_uncommitted wins (Spark's own source defaults to it).
DEFAULT_ISOLATION_LEVEL = "read_committed"
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
DEFAULT_METADATA_TIMEOUT_MS = 10_000
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

_SUBSCRIPTION_OPTIONS = ("subscribe", "subscribePattern", "assign")
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_TIME_UNITS_MS["d"] = 86_400_000


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
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    metadata_timeout_ms: int = DEFAULT_METADATA_TIMEOUT_MS
    # kafka-python keyword arguments from kafka.* options (may hold secrets).
    kafka_params: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def consumer_config(self) -> dict[str, Any]:
        """kafka-python settings for a consumer that owns no offsets and joins no group."""
        config: dict[str, Any] = dict(_THROUGHPUT_DEFAULTS)
        config["isolation_level"] = DEFAULT_ISOLATION_LEVEL
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


class _Options:
    """Case-insensitive view of Spark's option map."""

    def __init__(self, raw: Mapping[str, str]) -> None:
        self._values = {str(k).lower(): v for k, v in raw.items()}

    def get(self, name: str) -> str | None:
        value = self._values.get(name.lower())
        return None if value is None else str(value)

    def present(self, name: str) -> bool:
        value = self.get(name)
        return value is not None and value.strip() != ""

    def items_with_prefix(self, prefix: str) -> list[tuple[str, str]]:
        return sorted(
            (k[len(prefix) :], str(v)) for k, v in self._values.items() if k.startswith(prefix)
        )


def parse_options(raw: Mapping[str, str]) -> KafkaSourceOptions:
    """Validate Spark's options for this source; raise KafkaSourceOptionError on bad input."""
    options = _Options(raw)
    bootstrap = (options.get("kafka.bootstrap.servers") or "").strip()
    if not bootstrap:
        raise KafkaSourceOptionError(
            "Option kafka.bootstrap.servers is required: set it to host:port[,host:port...]"
        )
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    for server in servers:
        if not re.fullmatch(r"\[?[^\s\[\]]+\]?:\d+", server):
            raise KafkaSourceOptionError(
                f"Option kafka.bootstrap.servers has {server!r}: use host:port[,host:port...]"
            )
    max_offsets = _positive_long(options, "maxOffsetsPerTrigger")
    min_offsets = _positive_long(options, "minOffsetsPerTrigger")
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise KafkaSourceOptionError(
            f"Option minOffsetsPerTrigger ({min_offsets}) exceeds maxOffsetsPerTrigger"
            f" ({max_offsets}): lower minOffsetsPerTrigger or raise maxOffsetsPerTrigger"
        )
    return KafkaSourceOptions(
        bootstrap_servers=",".join(servers),
        subscription=_subscription(options),
        starting=_starting_bound(options),
        ending=_ending_bound(options),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=_positive_long(options, "minPartitions"),
        fail_on_data_loss=_boolean(options, "failOnDataLoss", True),
        include_headers=_boolean(options, "includeHeaders", False),
        poll_timeout_ms=_positive_long(options, "kafkaConsumer.pollTimeoutMs")
        or DEFAULT_POLL_TIMEOUT_MS,
        metadata_timeout_ms=_metadata_timeout(options),
        kafka_params=_kafka_params(options),
    )


def _subscription(options: _Options) -> Subscription:
    given = [name for name in _SUBSCRIPTION_OPTIONS if options.get(name) is not None]
    if len(given) != 1:
        found = "none" if not given else " and ".join(given)
        raise KafkaSourceOptionError(
            f"Set exactly one of the options subscribe, subscribePattern or assign (found {found})"
        )
    kind = given[0]
    value = (options.get(kind) or "").strip()
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise KafkaSourceOptionError(
                "Option subscribe is empty: set it to a comma-separated list of topics"
            )
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        if not value:
            raise KafkaSourceOptionError(
                "Option subscribePattern is empty: set it to a regular expression of topic names"
            )
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
        if not isinstance(numbers, list) or not all(_is_int(n) and n >= 0 for n in numbers):
            raise KafkaSourceOptionError(
                f"Option assign lists {numbers!r} for topic {topic}: use a JSON list of"
                ' partition numbers, e.g. {"topic":[0,1]}'
            )
        partitions.extend((topic, int(n)) for n in numbers)
    if not partitions:
        raise KafkaSourceOptionError('Option assign names no partition: use e.g. {"topic":[0,1]}')
    return Subscription("assign", partitions=tuple(sorted(set(partitions))))


def _starting_bound(options: _Options) -> OffsetBound | None:
    strategy = (options.get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise KafkaSourceOptionError(
            f"Option startingOffsetsByTimestampStrategy is {strategy!r}: use error or latest"
        )
    if options.present("startingTimestamp"):
        return OffsetBound(
            "timestamp",
            "startingTimestamp",
            timestamp=_timestamp(options, "startingTimestamp"),
            timestamp_strategy=strategy,  # type: ignore[arg-type]
        )
    if options.present("startingOffsetsByTimestamp"):
        return OffsetBound(
            "timestamps",
            "startingOffsetsByTimestamp",
            per_partition=_partition_json(options, "startingOffsetsByTimestamp", timestamps=True),
            timestamp_strategy=strategy,  # type: ignore[arg-type]
        )
    if options.present("startingOffsets"):
        return _offsets_bound(options, "startingOffsets")
    return None


def _ending_bound(options: _Options) -> OffsetBound | None:
    if options.present("endingTimestamp"):
        return OffsetBound(
            "timestamp", "endingTimestamp", timestamp=_timestamp(options, "endingTimestamp")
        )
    if options.present("endingOffsetsByTimestamp"):
        return OffsetBound(
            "timestamps",
            "endingOffsetsByTimestamp",
            per_partition=_partition_json(options, "endingOffsetsByTimestamp", timestamps=True),
        )
    if options.present("endingOffsets"):
        bound = _offsets_bound(options, "endingOffsets")
        if bound.kind == "earliest" or EARLIEST in bound.as_dict().values():
            raise KafkaSourceOptionError(
                "Option endingOffsets cannot be earliest (-2): use latest, -1, or an offset"
            )
        return bound
    return None


def _offsets_bound(options: _Options, name: str) -> OffsetBound:
    value = (options.get(name) or "").strip()
    if value.lower() in ("earliest", "latest"):
        return OffsetBound(value.lower(), name)  # type: ignore[arg-type]
    return OffsetBound("offsets", name, per_partition=_partition_json(options, name))


def _partition_json(
    options: _Options, name: str, timestamps: bool = False
) -> tuple[tuple[TopicPartitionKey, int], ...]:
    example = '{"topic":{"0":1700000000000}}' if timestamps else '{"topic":{"0":23,"1":-2}}'
    accepted = "earliest, latest or JSON like " if not timestamps else "JSON like "
    value = (options.get(name) or "").strip()
    parsed = _json_object(value, name, example, accepted)
    result: list[tuple[TopicPartitionKey, int]] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict) or not partitions:
            raise KafkaSourceOptionError(
                f"Option {name} maps topic {topic} to {partitions!r}: use {accepted}{example}"
            )
        for partition, number in partitions.items():
            if not str(partition).isdigit():
                raise KafkaSourceOptionError(
                    f"Option {name} has partition {partition!r} for topic {topic}:"
                    f" partitions are non-negative integers, e.g. {example}"
                )
            lowest = 0 if timestamps else EARLIEST
            if not _is_int(number) or number < lowest:
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


def _positive_long(options: _Options, name: str) -> int | None:
    value = options.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        number = int(value.strip())
    except ValueError:
        number = None
    if number is None or number <= 0:
        raise KafkaSourceOptionError(f"Option {name} is {value!r}: use a positive integer")
    return number


def _timestamp(options: _Options, name: str) -> int:
    value = (options.get(name) or "").strip()
    if not value.isdigit():
        raise KafkaSourceOptionError(
            f"Option {name} is {value!r}: use a timestamp in epoch milliseconds"
        )
    return int(value)


def _boolean(options: _Options, name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None or value.strip() == "":
        return default
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise KafkaSourceOptionError(f"Option {name} is {value!r}: use true or false")
    return lowered == "true"


def _duration_ms(options: _Options, name: str, default: int) -> int:
    """Parse a Spark time string (e.g. 15m, 30s, 500ms; a bare number is milliseconds)."""
    value = options.get(name)
    if value is None or value.strip() == "":
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", value.lower())
    if not match or (match.group(2) or "ms") not in _TIME_UNITS_MS:
        raise KafkaSourceOptionError(
            f"Option {name} is {value!r}: use a duration such as 500ms, 30s, 15m or 1h"
        )
    return int(int(match.group(1)) * _TIME_UNITS_MS[match.group(2) or "ms"])


def _metadata_timeout(options: _Options) -> int:
    value = options.get("kafka.request.timeout.ms")
    if value is None:
        return DEFAULT_METADATA_TIMEOUT_MS
    return kafka_value(
        "request.timeout.ms", "request_timeout_ms", value, "consumer", KafkaSourceOptionError
    )


def _kafka_params(options: _Options) -> tuple[tuple[str, Any], ...]:
    raw = dict(options.items_with_prefix("kafka."))
    raw.pop("bootstrap.servers", None)
    params: dict[str, Any] = {}
    level = raw.pop("isolation.level", None)
    if level is not None:
        if level.strip().lower() not in ISOLATION_LEVELS:
            raise KafkaSourceOptionError(
                f"Option kafka.isolation.level is {level!r}: use read_committed (the"
                " default) or read_uncommitted"
            )
        params["isolation_level"] = level.strip().lower()
    refused = _REFUSED_KAFKA_OPTIONS
    error = KafkaSourceOptionError
    params.update(kafka_client_params(raw, "consumer", refused, error, "replayable-kafka"))
    return tuple(sorted(params.items()))
