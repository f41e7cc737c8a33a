"""``writeStream.format("2pc-kafka")``: exactly-once Kafka records from Spark micro-batches.

Guarantee: with ``deliveryGuarantee=exactly-once`` (default) a ``read_committed`` consumer
sees each row of each micro-batch exactly once, across crashes of the driver or executors,
task retries and broker restarts, provided the query restarts from its checkpoint within
``transaction.timeout.ms`` of a crash. Tasks write their rows in Kafka transactions and
leave them open; the driver records the decision in the ledger topic and commits every
transaction by producer id and epoch; recovery rolls decided transactions forward and
fences the rest (``eospack.connectors.kafka.sink.resource``). A prepared transaction the broker
aborted because the query stayed down too long is detected at the restart, which fails
with ``DecidedPieceLostError``: never silently lost. ``read_uncommitted`` consumers see
records of transactions that are later aborted (a retried task, a replayed batch).
``at-least-once`` sends without transactions: retries may duplicate records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructType,
)

from eospack.core.logs import make_logs_visible

from ....commit_protocols import TaskIdentity, TwoPhaseCommitStreamWriter
from ....commit_protocols.pieces import PreparedPiece
from ..client.ride_through import asked_again
from ..errors import KafkaSinkOptionError
from ..records import native_path
from .checkpoint_record import check_against_record
from .cluster_identity import (
    BROKER_TIMEOUT_SETTING,
    cluster_facts,
)
from .ledger import ensure_ledger_topic, is_ledger_topic
from .options import (
    SINK_NAME,
    KafkaSinkOptions,
    parse_options,
)
from .resource import KafkaResource
from .writer import prepare_task, write_directly

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
        started = options
        facts = asked_again(
            "asking the cluster for its id",
            lambda: cluster_facts(started, fit_timeout=started.exactly_once),
            start_deadline_seconds(options),
            SINK_NAME,
        )
        options = replace(options, cluster_id=facts.cluster_id)
        check_against_record(options)
        identified = options
        asked_again(
            "checking the topic option",
            lambda: check_topic_option(identified),
            start_deadline_seconds(options),
            SINK_NAME,
        )
        if options.exactly_once:
            options = with_broker_timeout(options, facts.transaction_max_timeout_ms)
            # Before any transaction begins: a ledger topic the user may not create fails
            # the query here, in one line, instead of the first commit after tasks ran.
            fitted = options
            asked_again(
                "checking the ledger topic",
                lambda: ensure_ledger_topic(fitted),
                start_deadline_seconds(options),
                SINK_NAME,
            )
        return KafkaStreamWriter(options)


def start_deadline_seconds(options: KafkaSinkOptions) -> float:
    """How long a query-start broker call is asked again while brokers fail (one down in a
    rolling restart): the client's ``kafka.request.timeout.ms`` (30 s by default), as the
    replayable-kafka source's driver calls."""
    return int(options.client_config().get("request_timeout_ms") or 30_000) / 1000


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


def check_topic_option(options: KafkaSinkOptions) -> None:
    """At query start: the ``topic`` option is no ledger topic (the tasks' guard, asked
    early so that a refusal, or the warning that it cannot be checked, comes first)."""
    if options.topic is not None and is_ledger_topic(options, options.topic):
        raise KafkaSinkOptionError(
            f"Option topic is {options.topic}, a ledger topic of 2pc-kafka (where sinks keep"
            " their decisions): write to another topic"
        )


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
