"""Options of ``writeStream.format("2pc-kafka")``, parsed once into a frozen, typed object.

The names are those of Spark's built-in Kafka sink (``kafka.bootstrap.servers``, ``topic``,
``kafka.*`` for the producer), plus eospack's sink options (``deliveryGuarantee``,
``sinkId``) and ``ledgerTopic``, where the driver keeps its decisions. Options are read
through ``eospack.core.options.OptionReader`` (case-insensitive names). Every error is one line
naming the option and the fix, raised before any data moves; secret values never appear in
errors or reprs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eospack.core.options import OptionReader

from ....commit_protocols.sink_options import parse_sink_common_options
from ..client.config import kafka_client_params, kafka_value
from ..errors import KafkaSinkOptionError

DEFAULT_LEDGER_TOPIC = "eospack-2pc-kafka-ledger"
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
"""Kafka's default ``transaction.max.timeout.ms`` (15 minutes): the longest a broker lets a
prepared transaction wait for the driver's commit, so the longest the query may stay down."""

# Producer settings this sink owns, with the fix to offer.
REFUSED_PRODUCER_OPTIONS = {
    "transactional.id": "the sink gives each task its own transactional id",
    "key.serializer": "write a key column of type binary or string instead",
    "value.serializer": "write a value column of type binary or string instead",
    "enable.idempotence": "the sink sets it: transactions need the idempotent producer",
    "acks": "the sink sets acks=all: a record acknowledged by one broker only can be lost",
    "interceptor.classes": "producer interceptors are not supported",
}

SINK_NAME = "2pc-kafka"
"""The format's name (``writeStream.format``), also the name in its log lines and errors."""


@dataclass(frozen=True)
class KafkaSinkOptions:
    bootstrap_servers: str
    topic: str | None = None
    """Overrides the rows' ``topic`` column, as in Spark's Kafka sink."""
    exactly_once: bool = True
    sink_id: str | None = None
    ledger_topic: str = DEFAULT_LEDGER_TOPIC
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    transaction_timeout_asked: bool = False
    """Whether ``kafka.transaction.timeout.ms`` was given (else the brokers' maximum is used)."""
    producer_params: tuple[tuple[str, Any], ...] = field(default=(), repr=False)
    checkpoint_location: str | None = None
    """Spark's ``checkpointLocation`` when the query gives it as an option (where
    ``checkpoint_record`` keeps what a restart must find)."""
    cluster_id: str | None = None
    """The cluster's own id, asked by the driver at query start (``sink/cluster_identity.py``)."""

    @property
    def target(self) -> str:
        """What the sink id is derived from together with the query id: the cluster by its
        id, never by the bootstrap list as typed (adding a broker, reordering the list or a
        space after a comma must not make a restarted query another sink, which would apply
        its replayed batch again), and the topic."""
        cluster = self.cluster_id or ",".join(bootstrap_list(self.bootstrap_servers))
        return f"kafka://{cluster}/{self.topic or '(topic column)'}"

    def describe(self) -> str:
        """For errors and logs: where, never who."""
        return f"Kafka {self.bootstrap_servers}, topic {self.topic or '(topic column)'}"

    def client_config(self) -> dict[str, Any]:
        """kafka-python settings every client of this sink shares (admin, ledger, tasks)."""
        return client_config(self.bootstrap_servers, self.producer_params)

    def producer_config(self) -> dict[str, Any]:
        """A task's producer: every record acknowledged by all in-sync replicas."""
        config = {**self.client_config(), "acks": "all", "enable_idempotence": True}
        if self.exactly_once:
            config["transaction_timeout_ms"] = self.transaction_timeout_ms
        return config


def client_config(
    bootstrap_servers: str, producer_params: tuple[tuple[str, Any], ...]
) -> dict[str, Any]:
    """kafka-python settings of clients of ``bootstrap_servers`` (a comma-separated list)
    with the ``kafka.*`` options given; a function of two hashable values, so that what is
    asked of a cluster once per process can be cached by them."""
    return {"bootstrap_servers": bootstrap_list(bootstrap_servers)} | dict(producer_params)


def bootstrap_list(bootstrap_servers: str) -> list[str]:
    """``host:port`` entries of a comma-separated list, stripped, without blanks or repeats."""
    servers = [server.strip() for server in bootstrap_servers.split(",")]
    return sorted({server for server in servers if server})


RESERVED_SINK_ID = "ledger"
"""The sink id whose transaction-id prefix (``eospack-ledger-``) is every ledger's."""


def parse_options(options: Mapping[str, str]) -> KafkaSinkOptions:
    """Validate every option once; raise ``KafkaSinkOptionError`` naming the option and fix."""
    reader = OptionReader(options, KafkaSinkOptionError)
    bootstrap = reader.required("kafka.bootstrap.servers", "host:port[,host:port...]")
    common = parse_sink_common_options(reader)
    if common.sink_id == RESERVED_SINK_ID:
        raise KafkaSinkOptionError(
            f"Option sinkId '{RESERVED_SINK_ID}' is reserved by 2pc-kafka (its ledgers'"
            f" transactional ids are eospack-{RESERVED_SINK_ID}-<sinkId>): choose another"
            " sinkId"
        )
    topic = reader.text("topic")
    ledger_topic = reader.identity("ledgerTopic", "a topic name", DEFAULT_LEDGER_TOPIC)
    if ledger_topic == topic:
        raise KafkaSinkOptionError(
            "Option ledgerTopic must name a topic of its own (the sink's decisions), not the"
            " output topic"
        )
    kafka_options = dict(reader.with_prefix("kafka."))
    kafka_options.pop("bootstrap.servers", None)
    timeout = kafka_options.pop("transaction.timeout.ms", None)
    timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS
    if timeout is not None:
        timeout_ms = kafka_value(
            "transaction.timeout.ms",
            "transaction_timeout_ms",
            timeout,
            "producer",
            KafkaSinkOptionError,
        )
        if timeout_ms < 1000:
            raise reader.refuse(
                "kafka.transaction.timeout.ms",
                "at least 1000 (the default, 900000, is the broker's usual maximum)",
            )
    params = kafka_client_params(
        kafka_options, "producer", REFUSED_PRODUCER_OPTIONS, KafkaSinkOptionError, "2pc-kafka"
    )
    params = with_compression_type(params)
    return KafkaSinkOptions(
        bootstrap_servers=bootstrap,
        topic=topic,
        exactly_once=common.exactly_once,
        sink_id=common.sink_id,
        ledger_topic=ledger_topic,
        transaction_timeout_ms=timeout_ms,
        transaction_timeout_asked=timeout is not None,
        producer_params=params,
        checkpoint_location=reader.text("checkpointLocation"),
    )


COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")


def with_compression_type(
    params: tuple[tuple[str, Any], ...],
) -> tuple[tuple[str, Any], ...]:
    """``kafka.compression.type`` as Kafka spells it (any case; ``none`` is no compression,
    as in Spark's sink, which kafka-python spells None); anything else refused in one line."""
    settings = dict(params)
    if "compression_type" not in settings:
        return params
    codec = str(settings["compression_type"]).strip().lower()
    if codec not in COMPRESSION_TYPES:
        raise KafkaSinkOptionError(
            f"Option kafka.compression.type is {settings['compression_type']}: use one of"
            f" {', '.join(COMPRESSION_TYPES)}"
        )
    settings["compression_type"] = None if codec == "none" else codec
    return tuple(settings.items())
