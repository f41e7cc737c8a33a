"""``eospack checkpoint inspect``: what a streaming query's checkpoint holds, read only.

Per batch, the source offsets Spark planned and whether Spark committed the batch; per
stateful operator, its state store (partitions, last version, bytes, provider); and, given
a 2pc sink's options (2pc-jdbc, 2pc-s3, 2pc-kafka), that sink's decisions (decided, done
or an abort fence per batch, rows, pieces), its prepared pieces and what it has left behind
right now (prepared transactions, staged rows, multipart uploads, open Kafka transactions)
with what cleans it, as the sink's resource reports it
(``eospack.commit_protocols.inspection``). Nothing is written anywhere, so it is safe on a
running query (a batch in flight shows as not committed).

The sink is found the way the sink finds itself: its id derives from the query id in the
checkpoint's ``metadata`` and the target, unless the query set ``sinkId``.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eospack.commit_protocols.inspection import SinkState, no_decision_line
from eospack.core.checkpoint_files import CheckpointFiles, checkpoint_files
from eospack.core.errors import EospackError
from eospack.tools.formats import FORMATS, inspectable_sinks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STATE_FILE_SUFFIXES = (".delta", ".snapshot", ".changelog", ".zip")
PROVIDER_SETTING = "spark.sql.streaming.stateStore.providerClass"
PASSWORD_VARIABLE = "EOSPACK_JDBC_PASSWORD"


class CheckpointInspectError(EospackError, ValueError):
    """The path is not a streaming checkpoint, or the sink cannot be read."""


@dataclass(frozen=True)
class Batch:
    batch_id: int
    committed: bool
    source_offsets: list[Any]
    """One entry per source, as Spark wrote it (replayable-kafka: topic -> partition -> offset)."""


@dataclass(frozen=True)
class OperatorState:
    operator_id: str
    partitions: int
    last_version: int | None
    bytes: int
    name: str | None = None
    """The rest is read through Spark (``inspect --state``), for stateful_ops operators."""
    keys: int | None = None
    key_groups: int | None = None
    operator_name: str | None = None
    """The operator's stable name (``name=``, Flink's uid); None when unnamed."""


@dataclass(frozen=True)
class SinkLedger:
    sink_id: str
    target: str
    batches: list[dict[str, Any]]
    prepared_transactions: list[str]
    staged_rows: int
    cleanup: str
    kind: str = "2pc-jdbc"
    multipart_uploads: list[str] = field(default_factory=list)
    """2pc-s3: ``key (upload id)`` of each of the sink's uploads still in progress."""
    open_transactions: list[str] = field(default_factory=list)
    """2pc-kafka: the transactional ids of the sink's transactions still open."""
    prepared_pieces: list[str] = field(default_factory=list)
    """Transaction ids of the sink's pieces still prepared (any sink)."""
    leftovers: list[str] = field(default_factory=list)
    """Everything left behind, one line each (``SinkState.leftovers``)."""

    def left_behind(self) -> str:
        """The report's summary of what the sink left behind, in its format's words
        (``FormatEntry.left_behind``)."""
        entry = FORMATS.get(self.kind)
        summary = entry.left_behind if entry else "{leftovers} leftovers"
        return summary.format(
            prepared_transactions=len(self.prepared_transactions),
            staged_rows=self.staged_rows,
            multipart_uploads=len(self.multipart_uploads),
            open_transactions=len(self.open_transactions),
            leftovers=len(self.leftovers),
        )


@dataclass(frozen=True)
class CheckpointReport:
    path: str
    query_id: str
    batches: list[Batch]
    state_store_provider: str | None
    operators: list[OperatorState]
    sinks: list[SinkLedger] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)

    def to_text(self) -> str:
        lines = [f"checkpoint {self.path}", f"query id {self.query_id}", "batches:"]
        for batch in self.batches:
            state = "committed" if batch.committed else "NOT committed (replayed at restart)"
            offsets = "; ".join(json.dumps(offset) for offset in batch.source_offsets)
            lines.append(f"  {batch.batch_id}: {state}; offsets {offsets}")
        lines.append(f"state store provider: {self.state_store_provider or 'Spark default'}")
        for operator in self.operators:
            lines.append(
                f"  operator {operator.operator_id}: {operator.partitions} partitions,"
                f" last version {operator.last_version}, {operator.bytes:,} bytes"
                + (
                    f"; {operator.name}"
                    + (f" named {operator.operator_name}" if operator.operator_name else "")
                    + f": {operator.keys} keys in {operator.key_groups} key groups"
                    if operator.name
                    else ""
                )
            )
        for sink in self.sinks:
            lines.append(f"{sink.kind} sink {sink.sink_id} ({sink.target}):")
            for row in sink.batches:
                lines.append(
                    f"  batch {row['batch_id']}: {row['status']}, {row['rows']} rows,"
                    f" {row['pieces']} pieces"
                )
            lines.append(f"  left behind: {sink.left_behind()}")
            lines.extend(f"    {gid}" for gid in sink.prepared_transactions)
            lines.extend(f"    {upload}" for upload in sink.multipart_uploads)
            lines.extend(f"    {transaction}" for transaction in sink.open_transactions)
            lines.append(f"  {sink.cleanup}")
        return "\n".join(lines)


def inspect_checkpoint(
    path: str | Path | CheckpointFiles,
    jdbc_options: dict[str, str] | None = None,
    s3_options: dict[str, str] | None = None,
    spark: SparkSession | None = None,
    kafka_options: dict[str, str] | None = None,
    sink_options: Mapping[str, Mapping[str, str]] | None = None,
) -> CheckpointReport:
    """Read ``path`` (a local checkpoint directory, a ``file://`` URI, or any Hadoop file
    system URI such as ``s3a://``, read through ``spark``'s Hadoop file system, default the
    active session: ``eospack.core.checkpoint_files``) and, with
    ``jdbc_options`` (``url``, ``dbtable``, optional ``user`` and ``sinkId``; the password
    from ``EOSPACK_JDBC_PASSWORD``), that 2pc-jdbc sink; with ``s3_options`` (``path``,
    optional ``endpointUrl``, ``region``, ``sinkId``; credentials from boto3's default
    chain), that 2pc-s3 sink; with ``kafka_options`` (``kafka.bootstrap.servers``,
    ``topic``, optional ``ledgerTopic``, ``sinkId``), that 2pc-kafka sink. Each sink is read
    through its resource (``inspect_sink``), never written; ``sink_options`` maps any
    inspectable sink format (``eospack.tools.formats``) to its options the same way. With
    ``spark``, each stateful_ops operator's name, keys and key groups at the last committed
    batch."""
    files = path if isinstance(path, CheckpointFiles) else checkpoint_files(path, spark)
    metadata = files.read_text("metadata")
    if metadata is None:
        raise CheckpointInspectError(
            f"{files.location} is not a streaming checkpoint (no metadata file): give the"
            " checkpointLocation of a query"
        )
    query_id = _query_id(metadata, files.uri("metadata"))
    committed = _numbered(files, "commits")
    batches, provider = [], None
    for batch_id in sorted(_numbered(files, "offsets")):
        lines = (files.read_text(f"offsets/{batch_id}") or "").splitlines()
        settings = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
        provider = settings.get(PROVIDER_SETTING, provider)
        offsets = [json.loads(line) if line != "-" else None for line in lines[2:]]
        batches.append(Batch(batch_id, batch_id in committed, offsets))
    report = CheckpointReport(files.location, query_id, batches, provider, _operators(files))
    if spark is not None:
        last = max((batch.batch_id for batch in batches if batch.committed), default=None)
        report.operators[:] = [
            _with_keys(spark, files.location, operator, last) for operator in report.operators
        ]
    sinks: dict[str, Mapping[str, str] | None] = {
        "2pc-jdbc": jdbc_options,
        "2pc-s3": s3_options,
        "2pc-kafka": kafka_options,
        **(sink_options or {}),
    }
    jdbc = sinks.get("2pc-jdbc")
    if jdbc:
        password = os.environ.get(PASSWORD_VARIABLE)
        sinks["2pc-jdbc"] = {**jdbc, **({"password": password} if password else {})}
    for sink_format, options in sinks.items():
        if options:
            report.sinks.append(_ledger_of(inspect_sink(sink_format, query_id, options)))
    return report


def _query_id(text: str, metadata: str) -> str:
    """The query id on the first line of a checkpoint's ``metadata`` (``{"id": ...}``)."""
    lines = text.splitlines()
    try:
        query_id = json.loads(lines[0])["id"] if lines else None
    except (ValueError, TypeError, KeyError):
        query_id = None
    if not isinstance(query_id, str) or not query_id:
        raise CheckpointInspectError(
            f"{metadata} holds no streaming query id: give the checkpointLocation of a query"
        )
    return query_id


def _numbered(files: CheckpointFiles, directory: str) -> set[int]:
    return {int(name) for name in files.names(directory) if name.isdigit()}


def _operators(files: CheckpointFiles) -> list[OperatorState]:
    operators: list[OperatorState] = []
    for operator in sorted((name for name in files.names("state") if name.isdigit()), key=int):
        partitions = [name for name in files.names(f"state/{operator}") if name.isdigit()]
        versions, size = [], 0
        for relative, length in files.file_sizes(f"state/{operator}"):
            size += length
            file = Path(relative)
            if file.suffix in STATE_FILE_SUFFIXES and file.stem.isdigit():
                versions.append(int(file.stem))
        operators.append(
            OperatorState(operator, len(partitions), max(versions, default=None), size)
        )
    return operators


def _with_keys(
    spark: SparkSession, directory: str, operator: OperatorState, batch_id: int | None
) -> OperatorState:
    """``operator`` with its stateful_ops keys and key groups (unchanged for Spark's own
    operators, whose state is not eospack's group-state table, and for a user's own
    transformWithState operator, which Spark's operator metadata names as it names the
    segment log's, but which holds no ``segments`` state variable: the state data source
    refuses it with a STDS_ error)."""
    from pyspark.errors import AnalysisException, SparkRuntimeException

    from eospack.stateful_ops.state_reader import state_frame

    if batch_id is None:
        return operator
    try:
        stored = state_frame(spark, directory, batch_id, int(operator.operator_id))
    except AnalysisException:  # not a group-state table: another kind of operator
        return operator
    except SparkRuntimeException as error:
        condition = getattr(error, "getCondition", error.getErrorClass)()
        if not str(condition or "").startswith("STDS_"):
            raise
        return operator  # the state data source refuses it as ours: another kind of operator
    if stored is None:
        return operator
    return replace(
        operator,
        name=stored.kind or None,
        keys=stored.rows,
        key_groups=stored.key_groups or None,
        operator_name=stored.operator_name,
    )


SINK_INSPECTORS: dict[str, str] = {
    entry.name: str(entry.sink_inspector) for entry in inspectable_sinks() if entry.sink_inspector
}
"""Format name -> the connector's ``inspect_sink(query_id, options) -> SinkState``: parse
the options, derive the sink id as the sink does, build its resource and inspect it (the
entries of ``eospack.tools.formats``)."""


def inspect_sink(sink_format: str, query_id: str, options: Mapping[str, str]) -> SinkState:
    """The state of the ``sink_format`` sink a query of ``query_id`` writes with ``options``,
    through its resource (``TransactionalResource.inspect``: read only). Any failure to
    read it is one line (``CheckpointInspectError``) naming the sink, never a credential."""
    target = SINK_INSPECTORS.get(sink_format)
    if target is None:
        known = ", ".join(sorted(SINK_INSPECTORS))
        raise CheckpointInspectError(f"no inspection for format {sink_format}: use one of {known}")
    module, _, function = target.partition(":")
    inspect = getattr(importlib.import_module(module), function)
    try:
        state: SinkState = inspect(query_id, options)
    except Exception as error:  # one line for the CLI, whatever the client raised
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CheckpointInspectError(f"{sink_format} sink cannot be read: {first_line}") from error
    if not (state.decisions or state.prepared_pieces or state.leftovers):
        state = replace(state, cleanup=no_decision_line(state.sink_id))
    return state


def _ledger_of(state: SinkState) -> SinkLedger:
    """The report's view of a sink state (the shape ``--json`` has printed since 2pc-jdbc)."""

    def named(kind: str) -> list[str]:
        return [leftover.name for leftover in state.leftovers if leftover.kind == kind]

    return SinkLedger(
        sink_id=state.sink_id,
        target=state.target,
        batches=[asdict(decision) for decision in state.decisions],
        prepared_transactions=named("prepared transaction"),
        staged_rows=sum(
            leftover.count for leftover in state.leftovers if leftover.kind == "staged rows"
        ),
        cleanup=state.cleanup,
        kind=state.format,
        multipart_uploads=named("multipart upload"),
        open_transactions=named("open Kafka transaction"),
        prepared_pieces=list(state.prepared_pieces),
        leftovers=[leftover.what for leftover in state.leftovers],
    )
