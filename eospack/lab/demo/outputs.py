"""Where the demo's pipelines print their counts, and how the demo reads them back.

One class per ``--sink``, both of the shape ``Output``, so that the orchestrator
(``eospack.lab.demo.run``) does not care which sink the pipelines write with:

- ``JdbcOutput``: PostgreSQL tables ``<name>_current`` and ``<name>_history``, read with
  SQL.
- ``KafkaOutput``: one topic per pipeline, read by one read_committed consumer per
  pipeline that stays open for the whole run (each record is read once, while sampling or
  at the end).

What a pipeline's sinks left behind (prepared transactions, staged rows, open Kafka
transactions, decisions not done) is asked of each sink's resource
(``eospack.tools.checkpoint.inspect_sink``, read only), for the sink id the sink derives from
its checkpoint's query id: never read from the sink's tables or topics here.

The verdict itself is ``eospack.lab.demo.verify.check_pipeline`` for both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from eospack.core.checkpoint_files import LocalFiles
from eospack.lab.demo.verify import PipelineResult, PrintedCounts, check_pipeline, count_decreases

if TYPE_CHECKING:
    import psycopg
    from kafka import KafkaConsumer, TopicPartition

    from eospack.lab.demo.pipeline import PipelineCommand

SAMPLE_POLL_MS = 50
"""One poll of a sampling consumer when nothing is new: the orchestrator's loop waits on it."""
SAMPLE_BUDGET_SECONDS = 1.0
"""At most this long per sample and pipeline, so kills and progress lines stay on time; what
is left is read at the next sample."""
FINAL_READ_SECONDS = 60.0


@dataclass(frozen=True)
class Sample:
    """A pipeline's output at one moment: its counted total, and how many counts went
    down since the previous sample (0 unless exactly-once is broken)."""

    counted: int
    regressions: int


class Output(Protocol):
    """What the orchestrator needs from the sink the pipelines print into."""

    def describe(self) -> str:
        """Where the counts go, for the first progress line."""
        ...

    def with_sink(self, command: PipelineCommand) -> PipelineCommand:
        """``command`` (of the pipeline ``command.name``) printing into this sink."""
        ...

    def sample(self) -> dict[str, Sample]:
        """Every pipeline's output as it is now (called every loop of the orchestrator)."""
        ...

    def leftovers(self, name: str) -> int:
        """What the sink of ``name`` left unfinished: must be 0 once the pipelines ended."""
        ...

    def verify(
        self, name: str, produced: Mapping[str, int], crashes: int, sampled_regressions: int
    ) -> PipelineResult:
        """Read ``name``'s whole output and judge it (``check_pipeline``)."""
        ...

    def close(self) -> None: ...


class JdbcOutput:
    """2pc-jdbc: each pipeline writes ``<name>_current`` (upsert with versionColumn: the
    count per key) and ``<name>_history`` (append: every printed count with its batch id)."""

    def __init__(
        self,
        jdbc_url: str,
        jdbc_user: str | None,
        names: list[str],
        guarantee: str,
        checkpoints: Mapping[str, Path],
    ) -> None:
        self.jdbc_url = jdbc_url
        self.jdbc_user = jdbc_user
        self.names = names
        self.checkpoints = dict(checkpoints)
        """Each pipeline's ``--checkpoint-dir`` (one query per table below it)."""
        self.guarantee = guarantee
        self.database_url = libpq_url(jdbc_url, jdbc_user)
        self.last_seen: dict[str, dict[str, int]] = {}

    def describe(self) -> str:
        return f"sinks 2pc-jdbc {self.guarantee} into <name>_current and <name>_history"

    def with_sink(self, command: PipelineCommand) -> PipelineCommand:
        return dataclasses.replace(
            command, sink="jdbc", jdbc_url=self.jdbc_url, jdbc_user=self.jdbc_user or None
        )

    def sample(self) -> dict[str, Sample]:
        """The current tables: a key's count going down between samples is a regression."""
        import psycopg

        samples = {}
        with psycopg.connect(self.database_url) as connection:
            for name in self.names:
                latest = read_current(connection, name)
                regressions = count_decreases(self.last_seen.get(name, {}), latest)
                self.last_seen[name] = latest
                samples[name] = Sample(sum(latest.values()), regressions)
        return samples

    def leftovers(self, name: str) -> int:
        """What the sinks of ``name``'s tables left behind and their decisions not done, as
        each sink's resource reports it (``SinkState.leftover_count``)."""
        from eospack.lab.demo.pipeline import TABLES  # not at the top: see committed_batches
        from eospack.tools.checkpoint import inspect_sink

        total = 0
        for table in TABLES:
            query_id = query_id_of(self.checkpoints[name] / table)
            if query_id is None:
                continue  # this query never started: it left nothing
            options = {"url": self.jdbc_url, "dbtable": f"{name}_{table}"}
            if self.jdbc_user:
                options["user"] = self.jdbc_user
            password = os.environ.get("EOSPACK_DEMO_JDBC_PASSWORD")
            if password:
                options["password"] = password
            state = inspect_sink("2pc-jdbc", query_id, options)
            if not state.decisions and self.guarantee == "exactly-once" and self._has_rows(name):
                # Rows without a decision: the id above is not the sink's, and the
                # inspection would find nothing whatever the sink left behind.
                raise RuntimeError(
                    f"{name}_{table}: no decision of sink {state.sink_id} in the ledger, though"
                    " the table has rows: the demo derived another sink id than 2pc-jdbc"
                )
            total += state.leftover_count()
        return total

    def _has_rows(self, name: str) -> bool:
        import psycopg

        with psycopg.connect(self.database_url) as connection:
            return bool(read_current(connection, name))

    def verify(
        self, name: str, produced: Mapping[str, int], crashes: int, sampled_regressions: int
    ) -> PipelineResult:
        import psycopg

        with psycopg.connect(self.database_url) as connection:
            current = read_current(connection, name)
            history = [
                (key, int(count), int(version), int(batch_id))
                for key, count, version, batch_id in connection.execute(
                    f'SELECT key, "count", version, batch_id FROM "{name}_history"'
                ).fetchall()
            ]
        return check_pipeline(
            name, crashes, produced, current, history, sampled_regressions, self.leftovers(name)
        )

    def close(self) -> None:
        pass


def libpq_url(jdbc_url: str, user: str | None) -> str:
    url = jdbc_url.removeprefix("jdbc:")
    if user and "@" not in url:
        password = os.environ.get("EOSPACK_DEMO_JDBC_PASSWORD", "")
        credentials = f"{user}:{password}" if password else user
        url = url.replace("postgresql://", f"postgresql://{credentials}@", 1)
    return url


def read_current(connection: psycopg.Connection, name: str) -> dict[str, int]:
    import psycopg

    try:
        rows = connection.execute(f'SELECT key, "count" FROM "{name}_current"').fetchall()
    except psycopg.errors.UndefinedTable:  # the table appears with the first batch
        connection.rollback()
        return {}
    return {key: int(count) for key, count in rows}


def query_id_of(checkpoint: Path) -> str | None:
    """The query id in a checkpoint's ``metadata``; None before the query's first start."""
    metadata = LocalFiles(checkpoint).read_text("metadata")  # the demo's are local
    if metadata is None:
        return None
    return str(json.loads(metadata.splitlines()[0])["id"])


class KafkaOutput:
    """2pc-kafka: each pipeline prints into its own topic ``<name>_out``, created here with
    the input's partition count; a read_committed consumer per pipeline reads it."""

    def __init__(
        self, bootstrap: str, checkpoints: Mapping[str, Path], partitions: int, guarantee: str
    ) -> None:
        from eospack.lab.services.kafka_tools import create_topic

        self.bootstrap = bootstrap
        self.checkpoints = dict(checkpoints)
        self.guarantee = guarantee
        self.topics = {name: f"{name}_out" for name in checkpoints}
        self.readers: dict[str, TopicReader] = {}
        try:
            for name, topic in self.topics.items():
                create_topic(bootstrap, topic, partitions)
                self.readers[name] = TopicReader(bootstrap, topic, partitions)
        except BaseException:
            self.close()
            raise

    def describe(self) -> str:
        return f"sink 2pc-kafka {self.guarantee} into <name>_out (read_committed)"

    def with_sink(self, command: PipelineCommand) -> PipelineCommand:
        return dataclasses.replace(command, sink="kafka", output_topic=self.topics[command.name])

    def sample(self) -> dict[str, Sample]:
        """What is new in each topic since the last sample: a key's count going down in
        offset order is a regression."""
        samples = {}
        for name, reader in self.readers.items():
            before = reader.counts.regressions
            reader.read_new(SAMPLE_BUDGET_SECONDS)
            samples[name] = Sample(reader.counts.counted, reader.counts.regressions - before)
        return samples

    def sink_id(self, name: str) -> str | None:
        """The sink id 2pc-kafka derived, as it derives it: from the query id in the
        checkpoint and the target; None before the query's first start wrote it."""
        from eospack.connectors.kafka.sink.cluster_identity import derived_sink_id
        from eospack.lab.demo.pipeline import KAFKA_QUERY  # not at the top: see committed_batches

        query_id = query_id_of(self.checkpoints[name] / KAFKA_QUERY)
        if query_id is None:
            return None
        return derived_sink_id(query_id, self.sink_options(name))

    def sink_options(self, name: str) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap, "topic": self.topics[name]}

    def leftovers(self, name: str) -> int:
        """The sink's transactions still open (prepared and never committed or fenced), its
        ledger transaction if open, and its decisions not done, as its resource reports them."""
        from eospack.lab.demo.pipeline import KAFKA_QUERY  # not at the top: see committed_batches
        from eospack.tools.checkpoint import inspect_sink

        query_id = query_id_of(self.checkpoints[name] / KAFKA_QUERY)
        if query_id is None:
            return 0
        state = inspect_sink("2pc-kafka", query_id, self.sink_options(name))
        if (
            not state.decisions
            and self.guarantee == "exactly-once"
            and self.readers[name].counts.history
        ):
            # Committed records without a decision: the id above is not the sink's, and
            # the inspection would find nothing whatever the sink left behind.
            raise RuntimeError(
                f"{name}: no decision of sink {state.sink_id} in its ledger topic, though its"
                " topic has committed records: the demo derived another sink id than 2pc-kafka"
            )
        return state.leftover_count()

    def verify(
        self, name: str, produced: Mapping[str, int], crashes: int, sampled_regressions: int
    ) -> PipelineResult:
        """The topic read to its end: current is the last count per key, history every
        record with its offset as position (one key's records share a partition).

        ``sampled_regressions`` is not added: sampling checked these very records in the
        same order, and ``check_pipeline`` checks them again from the history.
        """
        reader = self.readers[name]
        reader.read_to_end(FINAL_READ_SECONDS)
        counts = reader.counts
        return check_pipeline(
            name, crashes, produced, counts.current, counts.history, 0, self.leftovers(name)
        )

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


class TopicReader:
    """A read_committed consumer of one output topic, from its start, kept open between
    samples: each call reads only what is new. Records of aborted transactions (a crashed
    run's, a retried task's) are never returned; an open transaction holds the reader at
    its first offset until it is committed or fenced."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.topic = topic
        self.partitions = [TopicPartition(topic, partition) for partition in range(partitions)]
        self.consumer: KafkaConsumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
        )
        self.consumer.assign(self.partitions)
        self.consumer.seek_to_beginning(*self.partitions)
        self.counts = PrintedCounts()

    def read_new(self, budget_seconds: float) -> None:
        """Poll until nothing more arrives, or for ``budget_seconds`` at most."""
        until = time.monotonic() + budget_seconds
        while self._poll(SAMPLE_POLL_MS) and time.monotonic() < until:
            pass

    def read_to_end(self, timeout: float) -> None:
        """Read up to the current end offsets (for read_committed: the last stable offset,
        before any transaction still open)."""
        ends: dict[TopicPartition, int] = self.consumer.end_offsets(self.partitions)
        deadline = time.monotonic() + timeout
        while any(self.consumer.position(tp) < ends[tp] for tp in self.partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not read {self.topic} to its end offsets within {timeout:.0f} s"
                )
            self._poll(200)

    def _poll(self, timeout_ms: int) -> int:
        """One poll, fed to ``counts`` in offset order per partition; how many records."""
        polled = self.consumer.poll(timeout_ms=timeout_ms)
        for partition in sorted(polled, key=lambda tp: tp.partition):
            for record in polled[partition]:
                self.counts.add(record.key, record.value, record.offset)
        return sum(len(records) for records in polled.values())

    def close(self) -> None:
        self.consumer.close()
