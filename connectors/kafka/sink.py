"""``writeStream.format("2pc-kafka")``: exactly-once Kafka records from Spark micro-batches.

Guarantee: with ``deliveryGuarantee=exactly-once`` (default) a ``read_committed`` consumer
sees each row of each micro-batch exactly once, across crashes of the driver or executors,
task retries and broker restarts, provided the query restarts from its checkpoint within
``transaction.timeout.ms`` of a crash. Tasks write their rows in Kafka transactions and
leave them open; the driver records the decision in the ledger topic and commits every
transaction by producer id and epoch; recovery rolls decided transactions forward and
fences the rest (``eospack.connectors.kafka.resource``). A prepared transaction the broker
aborted because the query stayed down too long is detected at the restart, which fails
with ``DecidedPieceLostError``: never silently lost. ``read_uncommitted`` consumers see
records of transactions that are later aborted (a retried task, a replayed batch).
``at-least-once`` sends without transactions: retries may duplicate records.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from kafka import errors as kafka_errors
from kafka.admin import ConfigResource, ConfigResourceType
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructType,
)

from eospack.commit_protocols import TaskIdentity, TwoPhaseCommitStreamWriter, derive_sink_id
from eospack.commit_protocols.logs import make_logs_visible
from eospack.commit_protocols.pieces import PreparedPiece
from eospack.connectors.kafka import native_path
from eospack.connectors.kafka.checkpoint_record import check_against_record
from eospack.connectors.kafka.resource import KafkaResource
from eospack.connectors.kafka.sink_options import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    KafkaSinkOptionError,
    KafkaSinkOptions,
    client_config,
    parse_options,
)
from eospack.connectors.kafka.transactions import admin_client
from eospack.connectors.kafka.writer import prepare_task, write_directly

SINK_NAME = "2pc-kafka"
BROKER_TIMEOUT_SETTING = "transaction.max.timeout.ms"
logger = logging.getLogger(__name__)


class TwoPhaseKafkaDataSource(DataSource):
    """``writeStream.format("2pc-kafka")``: see the module doc."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        make_logs_visible()
        options = parse_options(self.options)
        if overwrite:
            raise KafkaSinkOptionError(
                "outputMode complete is not supported by 2pc-kafka: use append"
            )
        check_schema(options, schema)
        native_path.warn_if_reference_path()
        facts = cluster_facts(options)
        options = replace(options, cluster_id=facts.cluster_id)
        check_against_record(options)
        if options.exactly_once:
            options = with_broker_timeout(options, facts.transaction_max_timeout_ms)
        return KafkaStreamWriter(options)


def check_schema(options: KafkaSinkOptions, schema: StructType) -> None:
    """Spark's Kafka sink columns, with their types; refused before any data moves."""
    fields = {field.name: field.dataType for field in schema.fields}
    expected = {
        "value": "binary or string",
        "key": "binary or string",
        "topic": "string",
        "partition": "int",
        "headers": "array<struct<key: string, value: binary>>",
    }
    if "value" not in fields:
        raise KafkaSinkOptionError(
            "2pc-kafka needs a value column (binary or string): select or alias one"
        )
    if options.topic is None and "topic" not in fields:
        raise KafkaSinkOptionError(
            "2pc-kafka needs a topic: set the topic option, or write a topic column"
        )
    checks = {
        "value": isinstance(fields.get("value"), (BinaryType, StringType)),
        "key": isinstance(fields.get("key"), (BinaryType, StringType)),
        "topic": isinstance(fields.get("topic"), StringType) or options.topic is not None,
        "partition": isinstance(fields.get("partition"), IntegerType),
        "headers": _is_headers(fields.get("headers")),
    }
    for column, fits in checks.items():
        if column in fields and not fits:
            raise KafkaSinkOptionError(
                f"2pc-kafka column {column} has type {fields[column].simpleString()}: use"
                f" {expected[column]} (cast it first)"
            )


def _is_headers(data_type: object) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    element = {field.name: field.dataType for field in data_type.elementType.fields}
    return isinstance(element.get("key"), StringType) and isinstance(
        element.get("value"), (BinaryType, StringType)
    )


def with_broker_timeout(options: KafkaSinkOptions, maximum: int | None) -> KafkaSinkOptions:
    """The transaction timeout to use: the brokers' maximum unless a lower one was asked.
    Asking for more than the broker allows would fail every task: warn and use its maximum."""
    if maximum is None:
        return options
    if not options.transaction_timeout_asked:
        return replace(options, transaction_timeout_ms=maximum)
    if options.transaction_timeout_ms > maximum:
        logger.warning(
            "2pc-kafka: kafka.transaction.timeout.ms=%d is above the broker's %s=%d: using"
            " %d; a query down longer than that loses its prepared batch (the restart fails"
            " loudly). Raise %s on the brokers to allow more",
            options.transaction_timeout_ms,
            BROKER_TIMEOUT_SETTING,
            maximum,
            maximum,
            BROKER_TIMEOUT_SETTING,
        )
        return replace(options, transaction_timeout_ms=maximum)
    return options


def derived_sink_id(query_id: str, options: Mapping[str, str]) -> str:
    """The sink id that a query of ``query_id`` writing with ``options`` uses: ``sinkId``
    if given, else derived from the query id and the target as the tasks derive it (the
    cluster's id is asked, so the cluster must be up). For tools that inspect a sink."""
    parsed = parse_options(options)
    if parsed.sink_id is not None:
        return parsed.sink_id
    resolved = replace(parsed, cluster_id=cluster_facts(parsed).cluster_id)
    return derive_sink_id(query_id, resolved.target)


@dataclass(frozen=True)
class ClusterFacts:
    cluster_id: str | None
    """None only for a broker that reports none (then the sorted bootstrap list stands in)."""
    transaction_max_timeout_ms: int | None
    """The brokers' ``transaction.max.timeout.ms``; None when it could not be read."""


def cluster_facts(options: KafkaSinkOptions) -> ClusterFacts:
    """What the driver asks the cluster once per process: its id and its transaction
    timeout maximum."""
    return _cluster_facts(options.bootstrap_servers, options.producer_params)


@functools.cache
def _cluster_facts(
    bootstrap_servers: str, producer_params: tuple[tuple[str, Any], ...]
) -> ClusterFacts:
    """Cached by the cluster and the client settings used to ask it; a raised error is not
    cached. The timeout maximum may be unreadable (an ACL): the default applies, said once."""
    admin = admin_client(client_config(bootstrap_servers, producer_params))
    maximum: int | None = None
    try:
        cluster = admin.describe_cluster()
        broker = cluster["brokers"][0]["broker_id"]
        resource = ConfigResource(ConfigResourceType.BROKER, str(broker), [BROKER_TIMEOUT_SETTING])
        try:
            described = admin.describe_configs([resource], config_filter="all")
        except kafka_errors.KafkaError as error:
            logger.warning(
                "2pc-kafka could not read the brokers' %s (%s): using %d ms",
                BROKER_TIMEOUT_SETTING,
                type(error).__name__,
                DEFAULT_TRANSACTION_TIMEOUT_MS,
            )
            described = {}
        for names in described.values():
            for settings in names.values():
                if BROKER_TIMEOUT_SETTING in settings:
                    maximum = int(settings[BROKER_TIMEOUT_SETTING]["value"])
    finally:
        admin.close()
    return ClusterFacts(cluster.get("cluster_id") or None, maximum)


class KafkaStreamWriter(TwoPhaseCommitStreamWriter):
    """Prepares on executors (``writer``), commits on the driver (``KafkaResource``)."""

    sink_name = SINK_NAME

    def __init__(self, options: KafkaSinkOptions) -> None:
        super().__init__(options.sink_id, options.target, options.exactly_once)
        self.options = options

    def __repr__(self) -> str:
        return f"KafkaStreamWriter({self.options.describe()})"

    def prepare(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> PreparedPiece:
        return prepare_task(self.options, task, batches)

    def write_directly(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> int:
        return write_directly(self.options, batches)

    def open_resource(self) -> KafkaResource:
        return KafkaResource(self.options)
