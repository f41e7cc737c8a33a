"""``eospack checkpoint inspect``: what a streaming query's checkpoint holds, read only.

Per batch, the source offsets Spark planned and whether Spark committed the batch; per
stateful operator, its state store (partitions, last version, bytes, provider); and, given
the 2pc-jdbc sink's URL and table, that sink's ledger (decided/done per batch, rows,
pieces) and what it has left behind right now (prepared transactions, staged rows) with
what cleans it. Nothing is written anywhere, so it is safe on a running query (a batch in
flight shows as not committed).

The sink is found the way the sink finds itself: its id derives from the query id in the
checkpoint's ``metadata`` and the table, unless the query set ``sinkId``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from eospack.errors import EospackError

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
                    f"; {operator.name}: {operator.keys} keys in {operator.key_groups} key groups"
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
            if sink.kind == "2pc-s3":
                lines.append(
                    f"  left behind: {len(sink.multipart_uploads)} multipart uploads in progress"
                )
            else:
                lines.append(
                    f"  left behind: {len(sink.prepared_transactions)} prepared transactions,"
                    f" {sink.staged_rows} staged rows"
                )
            lines.extend(f"    {gid}" for gid in sink.prepared_transactions)
            lines.extend(f"    {upload}" for upload in sink.multipart_uploads)
            lines.append(f"  {sink.cleanup}")
        return "\n".join(lines)


def inspect_checkpoint(
    path: str | Path,
    jdbc_options: dict[str, str] | None = None,
    s3_options: dict[str, str] | None = None,
    spark: SparkSession | None = None,
) -> CheckpointReport:
    """Read ``path`` (a local checkpoint directory or ``file://`` URI) and, with
    ``jdbc_options`` (``url``, ``dbtable``, optional ``user`` and ``sinkId``), that
    2pc-jdbc sink; with ``s3_options`` (``path``, optional ``endpointUrl``, ``region``,
    ``sinkId``; credentials from boto3's default chain), that 2pc-s3 sink. With ``spark``,
    each stateful_ops operator's name, keys and key groups at the last committed batch."""
    text = str(path)
    directory = Path(unquote(urlsplit(text).path) if text.startswith("file:") else text)
    metadata = directory / "metadata"
    if not metadata.is_file():
        raise CheckpointInspectError(
            f"{directory} is not a streaming checkpoint (no metadata file): give the"
            " checkpointLocation of a query"
        )
    query_id = str(json.loads(metadata.read_text().splitlines()[0])["id"])
    committed = _numbered(directory / "commits")
    batches, provider = [], None
    for batch_id in sorted(_numbered(directory / "offsets")):
        lines = (directory / "offsets" / str(batch_id)).read_text().splitlines()
        settings = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
        provider = settings.get(PROVIDER_SETTING, provider)
        offsets = [json.loads(line) if line != "-" else None for line in lines[2:]]
        batches.append(Batch(batch_id, batch_id in committed, offsets))
    report = CheckpointReport(
        str(directory), query_id, batches, provider, _operators(directory / "state")
    )
    if spark is not None:
        last = max((batch.batch_id for batch in batches if batch.committed), default=None)
        report.operators[:] = [
            _with_keys(spark, directory, operator, last) for operator in report.operators
        ]
    if jdbc_options:
        report.sinks.append(_jdbc_sink(query_id, jdbc_options))
    if s3_options:
        report.sinks.append(_s3_sink(query_id, s3_options))
    return report


def _numbered(directory: Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(entry.name) for entry in directory.iterdir() if entry.name.isdigit()}


def _operators(state: Path) -> list[OperatorState]:
    operators: list[OperatorState] = []
    if not state.is_dir():
        return operators
    for operator in sorted(entry for entry in state.iterdir() if entry.name.isdigit()):
        partitions = [entry for entry in operator.iterdir() if entry.name.isdigit()]
        versions, size = [], 0
        for file in operator.rglob("*"):
            if file.is_file():
                size += file.stat().st_size
                if file.suffix in STATE_FILE_SUFFIXES and file.stem.isdigit():
                    versions.append(int(file.stem))
        operators.append(
            OperatorState(operator.name, len(partitions), max(versions, default=None), size)
        )
    return operators


def _with_keys(
    spark: SparkSession, directory: Path, operator: OperatorState, batch_id: int | None
) -> OperatorState:
    """``operator`` with its stateful_ops keys and key groups (unchanged for Spark's own
    operators, whose state is not eospack's group-state table)."""
    from pyspark.errors import AnalysisException

    from eospack.stateful_ops.state_reader import read_state_table

    if batch_id is None:
        return operator
    try:
        table = read_state_table(spark, str(directory), batch_id, int(operator.operator_id))
    except AnalysisException:  # not a group-state table: another kind of operator
        return operator
    if table is None:
        return operator
    metadata = table.schema.metadata or {}
    return replace(
        operator,
        name=metadata.get(b"operator", b"").decode() or None,
        keys=table.num_rows,
        key_groups=int(metadata.get(b"key_groups", b"0")) or None,
    )


def _jdbc_sink(query_id: str, raw: dict[str, str]) -> SinkLedger:
    from eospack.commit_protocols import derive_sink_id, sink_prefix
    from eospack.connectors.jdbc.dialect import stage_table
    from eospack.connectors.jdbc.options import dialect_for, parse_options
    from eospack.connectors.jdbc.postgres import PostgresDialect

    password = os.environ.get(PASSWORD_VARIABLE)
    options = parse_options({**raw, **({"password": password} if password else {})})
    dialect = dialect_for(options.url)
    if not isinstance(dialect, PostgresDialect):  # the queries below read its catalog
        raise CheckpointInspectError("checkpoint inspect reads PostgreSQL sinks only (url)")
    sink_id = options.sink_id or derive_sink_id(query_id, options.target)
    with dialect.connect(options, autocommit=True) as connection:
        ledger_exists = connection.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (options.ledger_table.sql(),)
        ).fetchone()
        ledger_rows = []
        if ledger_exists and ledger_exists[0]:
            ledger_rows = connection.execute(
                f"SELECT batch_id, status, rows, pieces FROM {options.ledger_table.sql()}"
                " WHERE sink_id = %s ORDER BY batch_id",
                (sink_id,),
            ).fetchall()
        prepared = dialect.prepared_gids(connection, sink_prefix(sink_id))
        stage = stage_table(options.table)
        staged = 0
        stage_exists = connection.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (stage.sql(),)
        ).fetchone()
        if stage_exists and stage_exists[0]:
            count = connection.execute(f"SELECT count(*) FROM {stage.sql()}").fetchone()
            staged = int(count[0]) if count else 0
    batches = [
        {
            "batch_id": int(batch),
            "status": status,
            "rows": int(count),
            "pieces": len(json.loads(pieces)),
        }
        for batch, status, count, pieces in ledger_rows
    ]
    left = bool(prepared or staged or any(row["status"] != "done" for row in batches))
    cleanup = (
        "nothing to clean"
        if not left
        else "start the query again from this checkpoint: its first commit finishes what a"
        " decision names and rolls back the rest (never ROLLBACK PREPARED by hand: a"
        " decided piece rolled back is data lost)"
    )
    return SinkLedger(sink_id, options.describe(), batches, prepared, staged, cleanup)


def _s3_sink(query_id: str, raw: dict[str, str]) -> SinkLedger:
    """2pc-s3 keeps no "done": a decided batch is finished when none of its uploads is in
    progress (see connectors/s3/resource.py), so that is what ``status`` says."""
    from eospack.commit_protocols import derive_sink_id
    from eospack.commit_protocols.pieces import ABORTED
    from eospack.connectors.s3.client import s3_client
    from eospack.connectors.s3.errors import S3WriteError
    from eospack.connectors.s3.options import parse_sink_options
    from eospack.connectors.s3.resource import S3Resource

    options = parse_sink_options(raw)
    sink_id = options.sink_id or derive_sink_id(query_id, options.target)
    resource = S3Resource(options, "", s3_client(options.connection))
    prefix = f"{options.location.manifests_prefix}{sink_id}/"
    try:
        names = [
            item["Key"][len(prefix) :].removesuffix(".json")
            for page in resource.client.get_paginator("list_objects_v2").paginate(
                Bucket=options.location.bucket, Prefix=prefix
            )
            for item in page.get("Contents", ())
        ]
        unfinished = {decision.batch_id for decision in resource.unfinished_decisions(sink_id)}
        batches = []
        for batch_id in sorted(int(name) for name in names if name.isdigit()):
            decision = resource.find_decision(sink_id, batch_id)
            if decision is None:
                continue
            status = "aborted (fence)" if decision.status == ABORTED else "done"
            if batch_id in unfinished:
                status = "decided"
            batches.append(
                {
                    "batch_id": batch_id,
                    "status": status,
                    "rows": sum(piece.rows for piece in decision.pieces),
                    "pieces": len(decision.pieces),
                }
            )
        uploads = [
            f"{file['key']} ({file['upload_id']})"
            for piece in resource.prepared_pieces(sink_id)
            for file in piece.handle.get("files", ())
        ]
    except S3WriteError as error:
        raise CheckpointInspectError(str(error)) from None
    cleanup = (
        "nothing to clean"
        if not uploads
        else "start the query again from this checkpoint: its first commit completes the"
        " uploads a decision names and aborts the rest (never abort them by hand: a decided"
        " upload aborted is data lost)"
    )
    return SinkLedger(
        sink_id, options.location.url, batches, [], 0, cleanup, "2pc-s3", sorted(uploads)
    )
