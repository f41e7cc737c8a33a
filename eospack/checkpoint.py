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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

STATE_FILE_SUFFIXES = (".delta", ".snapshot", ".changelog", ".zip")
PROVIDER_SETTING = "spark.sql.streaming.stateStore.providerClass"
PASSWORD_VARIABLE = "EOSPACK_JDBC_PASSWORD"


class CheckpointInspectError(ValueError):
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


@dataclass(frozen=True)
class SinkLedger:
    sink_id: str
    target: str
    batches: list[dict[str, Any]]
    prepared_transactions: list[str]
    staged_rows: int
    cleanup: str


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
            )
        for sink in self.sinks:
            lines.append(f"2pc-jdbc sink {sink.sink_id} ({sink.target}):")
            for row in sink.batches:
                lines.append(
                    f"  batch {row['batch_id']}: {row['status']}, {row['rows']} rows,"
                    f" {row['pieces']} pieces"
                )
            lines.append(
                f"  left behind: {len(sink.prepared_transactions)} prepared transactions,"
                f" {sink.staged_rows} staged rows"
            )
            lines.extend(f"    {gid}" for gid in sink.prepared_transactions)
            lines.append(f"  {sink.cleanup}")
        return "\n".join(lines)


def inspect_checkpoint(
    path: str | Path, jdbc_options: dict[str, str] | None = None
) -> CheckpointReport:
    """Read ``path`` (a local checkpoint directory or ``file://`` URI) and, with
    ``jdbc_options`` (``url``, ``dbtable``, optional ``user`` and ``sinkId``), the sink."""
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
    if jdbc_options:
        report.sinks.append(_jdbc_sink(query_id, jdbc_options))
    return report


def _numbered(directory: Path) -> set[int]:
    if not directory.is_dir():
        return set()
    return {int(entry.name) for entry in directory.iterdir() if entry.name.isdigit()}


def _operators(state: Path) -> list[OperatorState]:
    operators = []
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


def _jdbc_sink(query_id: str, raw: dict[str, str]) -> SinkLedger:
    from commit_protocols import derive_sink_id, sink_prefix
    from connectors.jdbc import postgres
    from connectors.jdbc.dialect import stage_table
    from connectors.jdbc.options import parse_options

    password = os.environ.get(PASSWORD_VARIABLE)
    options = parse_options({**raw, **({"password": password} if password else {})})
    if options.url.dialect != "postgresql":
        raise CheckpointInspectError("checkpoint inspect reads PostgreSQL sinks only (url)")
    sink_id = options.sink_id or derive_sink_id(query_id, options.target)
    with postgres.connect(options, autocommit=True) as connection:
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
        prepared = postgres.prepared_gids(connection, sink_prefix(sink_id))
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
