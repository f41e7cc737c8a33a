"""The contract suite's 2pc-kafka adapter on the session's broker: open transactions as
leftovers, the ledger topic's decisions."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from eospack.commit_protocols import sink_prefix
from integration_tests.sink_contract.base import (
    EXACTLY_ONCE,
    BoundSink,
    CallFaults,
    DocumentedOption,
    OptionChange,
    Options,
    Rows,
    SinkAdapter,
    _switch,
    hole,
)


class KafkaSink(BoundSink):
    broker_fixture: ClassVar[str] = "real_kafka"
    """The fixture of the broker the sink writes to (subclasses: a cluster, a secured one)."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.kafka = request.getfixturevalue(self.broker_fixture)
        self.bootstrap = self.kafka.endpoint.bootstrap_servers
        self.topic = self.topic_name(name)
        self.ledger_topic = f"{self.topic}_ledger"
        self.create_output_topic()
        self.held: list[Any] = []

    def topic_name(self, name: str) -> str:
        return name

    def create_output_topic(self) -> None:
        from eospack.lab.services.kafka_tools import create_topic

        create_topic(self.bootstrap, self.topic, 2)

    def client(self) -> dict[str, Any]:
        """kafka-python settings (beyond the bootstrap list) of the test's own reads and
        writes: the end state is read as a user who sees everything."""
        return {}

    def base_options(self) -> Options:
        # a ledger topic of the test's own: an open ledger transaction of one test must
        # not pin the ledger of the next (hole 1)
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            "topic": self.topic,
            "ledgerTopic": self.ledger_topic,
        }

    def parsed(self, options: Options) -> Any:
        from eospack.connectors.kafka.sink.options import parse_options

        return parse_options({key.lower(): value for key, value in options.items()})

    def config(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap, **self.client()}

    def rows(self, options: Options) -> Rows:
        from eospack.lab.services.kafka_tools import read_all

        records = read_all(
            self.bootstrap, self.topic, isolation_level="read_committed", client=self.client()
        )
        return Counter(
            (int(value.decode()), key.decode())
            for _, _, key, value in records
            if key is not None and value is not None
        )

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        from eospack.connectors.kafka.client.transactions import open_transactions

        found = []
        for sink_id in sorted(sink_ids):
            for prefix in (sink_prefix(sink_id), f"eospack-ledger-{sink_id}"):
                found += [f"open transaction {t}" for t in open_transactions(self.config(), prefix)]
        return found

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        from eospack.connectors.kafka.sink.ledger import read_slots

        found = {}
        ledgers = {self.ledger_topic, self.parsed(options).ledger_topic}
        for ledger in sorted(ledgers):
            for sink_id in sorted(sink_ids):
                for batch, slot in read_slots(self.config(), ledger, sink_id).items():
                    statuses = {"done": "done", "aborted": "aborted"}
                    found[(sink_id, batch)] = statuses.get(slot.status, "pending")
        return found

    @contextlib.contextmanager
    def another_sink_mid_decision(self, options: Options) -> Iterator[None]:
        """Another sink's ledger transaction, opened with a record on the shared ledger
        topic and neither committed nor aborted (a driver killed while writing its
        decision): it holds the ledger's last stable offset until the broker times it
        out."""
        from eospack.connectors.kafka.sink.ledger import ensure_ledger_topic
        from eospack.lab.services.kafka_tools import transactional_producer

        parsed = self.parsed(options)
        ensure_ledger_topic(parsed)
        producer = transactional_producer(
            self.bootstrap, "eospack-ledger-another_sink_mid_decision", **self.client()
        )
        try:
            producer.begin_transaction()
            producer.send(
                parsed.ledger_topic,
                key=b"another_sink_mid_decision/0",
                value=json.dumps({"pieces": [], "status": "decided"}).encode(),
                partition=0,
            ).get(timeout=30)
            yield
        finally:
            with contextlib.suppress(Exception):
                producer.abort_transaction()
            producer.close(timeout=5)

    def slow_batch(self) -> tuple[Options, float]:
        # the broker aborts a timed-out transaction at its next check, at most
        # transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s) later
        return {"kafka.transaction.timeout.ms": "2000"}, 20.0


def _bootstrap_forms(form: str) -> Callable[[BoundSink, Options], Options]:
    def change(sink: BoundSink, options: Options) -> Options:
        address = sink.bootstrap  # type: ignore[attr-defined]
        other = address.replace("127.0.0.1", "localhost")
        forms = {
            "localhost": other,
            "two_addresses": f"{address},{other}",
            "reordered": f"{other},{address}",
            "with_spaces": f"{other}, {address}",
        }
        return {**options, "kafka.bootstrap.servers": forms[form]}

    return change


def _other_ledger(sink: BoundSink, options: Options) -> Options:
    return {**options, "ledgerTopic": f"{sink.ledger_topic}_moved"}  # type: ignore[attr-defined]


class Kafka(SinkAdapter):
    name = "kafka"
    sink_format = "2pc-kafka"
    data_source = "eospack.connectors.kafka.sink.data_source:TwoPhaseKafkaDataSource"
    schema = "key STRING, value STRING"
    fixtures = ("real_kafka",)
    as_kafka_records = True
    calls = CallFaults(
        decide="kafka_sink.decide",
        commit_piece="kafka_sink.commit_piece",
        prepare="kafka_sink.prepare",
        every=("kafka_sink.prepare", "kafka_sink.decide", "kafka_sink.commit_piece"),
    )
    documented_options = (
        DocumentedOption("kafka.bootstrap.servers", lambda sink: sink.bootstrap),  # type: ignore[attr-defined]
        DocumentedOption("topic", lambda sink: sink.topic),  # type: ignore[attr-defined]
        DocumentedOption("kafka.security.protocol", "PLAINTEXT"),
        DocumentedOption("kafka.linger.ms", "5"),
        DocumentedOption("kafka.compression.type", "gzip"),
        DocumentedOption("kafka.batch.size", "65536"),
        DocumentedOption("kafka.retry.backoff.ms", "20"),
        DocumentedOption("kafka.transaction.timeout.ms", "60000"),
        DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
        DocumentedOption("ledgerTopic", lambda sink: f"{sink.topic}_documented_ledger"),  # type: ignore[attr-defined]
        DocumentedOption("sinkId", "contract_documented_options"),
    )
    option_changes = (
        OptionChange("bootstrap_localhost", _bootstrap_forms("localhost")),
        OptionChange("bootstrap_two_addresses", _bootstrap_forms("two_addresses"), chaos_only=True),
        OptionChange("bootstrap_reordered", _bootstrap_forms("reordered")),
        OptionChange("bootstrap_with_spaces", _bootstrap_forms("with_spaces")),
        OptionChange("kafka_linger_ms", _switch("kafka.linger.ms", "5"), chaos_only=True),
        OptionChange(
            "kafka_retry_backoff_ms", _switch("kafka.retry.backoff.ms", "30"), chaos_only=True
        ),
        OptionChange(
            "kafka_transaction_timeout_ms",
            _switch("kafka.transaction.timeout.ms", "120000"),
            chaos_only=True,
        ),
        OptionChange("ledgerTopic", _other_ledger, refusal_allowed="ledgerTopic"),
    )
    marks = {
        "test_a_batch_slower_than_the_sinks_timeout_replays_instead_of_wedging": hole(
            5,
            "residual: a decision write that outlasts kafka.transaction.timeout.ms after the"
            " liveness check decides dead transactions (every restart: DecidedPieceLostError)",
        ),
    }
    bound = KafkaSink
