"""The contract suite's 2pc-jdbc adapters: PostgreSQL with prepared transactions and with
staged rows, and SQLite."""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import psycopg
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
)


class JdbcSink(BoundSink):
    """Shared by the PostgreSQL and SQLite adapters: ledger and stage table are SQL."""

    table: str

    def parsed(self, options: Options) -> Any:
        from eospack.connectors.jdbc.options import parse_options

        return parse_options({key.lower(): value for key, value in options.items()})

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def table_exists(self, name: str) -> bool:
        raise NotImplementedError

    def rows(self, options: Options) -> Rows:
        if not self.table_exists(self.table):
            return Counter()
        return Counter(
            (int(row[0]), str(row[1])) for row in self.query(f'SELECT id, grp FROM "{self.table}"')
        )

    def staged_rows(self, sink_ids: set[str]) -> int:
        """Rows of these sinks in the table's stage (tagged with their piece ids)."""
        from eospack.connectors.jdbc.dialect import PIECE_COLUMN, TableName, stage_table

        stage = stage_table(TableName(None, self.table))
        if not self.table_exists(stage.name):
            return 0
        pieces = self.query(f'SELECT "{PIECE_COLUMN}" FROM {stage.sql()}')
        prefixes = tuple(sink_prefix(sink_id) for sink_id in sink_ids)
        return sum(1 for (piece,) in pieces if str(piece).startswith(prefixes))

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        ledger = self.parsed(options).ledger_table
        if not self.table_exists(ledger.name) or not sink_ids:
            return {}
        marks = ", ".join("?" if isinstance(self, SqliteSink) else "%s" for _ in sink_ids)
        found = self.query(
            f"SELECT sink_id, batch_id, status FROM {ledger.sql()} WHERE sink_id IN ({marks})",
            tuple(sorted(sink_ids)),
        )
        statuses = {"done": "done", "aborted": "aborted"}
        return {(str(s), int(b)): statuses.get(str(status), "pending") for s, b, status in found}


class PostgresSink(JdbcSink):
    protocol: ClassVar[str]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.server = request.getfixturevalue("postgres")
        self.table = name

    def base_options(self) -> Options:
        endpoint = self.server.endpoint
        options = {
            "url": endpoint.jdbc_url,
            "user": endpoint.user,
            "dbtable": self.table,
            "createTableIfNotExists": "true",
            "protocol": self.protocol,
        }
        if endpoint.password:
            options["password"] = endpoint.password
        return options

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.server.endpoint.url) as connection:
            return connection.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def table_exists(self, name: str) -> bool:
        return bool(self.query("SELECT to_regclass(%s)", (f'"{name}"',))[0][0])

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        prepared = self.query("SELECT gid FROM pg_prepared_xacts ORDER BY gid")
        found = [
            f"prepared transaction {gid}"
            for (gid,) in prepared
            if any(str(gid).startswith(sink_prefix(sink_id)) for sink_id in sink_ids)
        ]
        staged = self.staged_rows(sink_ids)
        return [*found, *([f"{staged} staged rows"] if staged else [])]

    @contextlib.contextmanager
    def another_sink_mid_decision(self, options: Options) -> Iterator[None]:
        """Another sink's decision INSERT into the shared ledger, its transaction left open
        (a driver hung, or its session not yet ended by the server after a crash)."""
        ledger = self.parsed(options).ledger_table
        with psycopg.connect(self.server.endpoint.url) as connection:
            connection.execute(
                f"INSERT INTO {ledger.sql()} (sink_id, batch_id, target, protocol, rows, status,"
                " pieces) VALUES ('another_sink_mid_decision', 0, %s, %s, 0, 'decided', '[]')",
                (self.table, self.protocol),
            )
            try:
                yield
            finally:
                connection.rollback()


def _jdbc_url_forms(sink: BoundSink, options: Options, form: str) -> Options:
    endpoint = sink.server.endpoint  # type: ignore[attr-defined]
    urls = {
        "libpq": f"postgresql://{endpoint.host}:{endpoint.port}/{endpoint.database}",
        "parameters": f"{endpoint.jdbc_url}?application_name=contract&connect_timeout=7",
        "localhost": endpoint.jdbc_url.replace(endpoint.host, "localhost"),
    }
    return {**options, "url": urls[form]}


POSTGRES_OPTIONS: tuple[DocumentedOption, ...] = (
    DocumentedOption("url", lambda sink: sink.server.endpoint.jdbc_url),  # type: ignore[attr-defined]
    DocumentedOption("dbtable", lambda sink: sink.table),  # type: ignore[attr-defined]
    DocumentedOption("user", lambda sink: sink.server.endpoint.user),  # type: ignore[attr-defined]
    DocumentedOption("password", lambda sink: sink.server.endpoint.password or "unused"),  # type: ignore[attr-defined]
    DocumentedOption("batchsize", "7"),
    DocumentedOption("writeMode", "upsert", extra={"upsertKeys": "id"}),
    DocumentedOption("upsertKeys", "id", extra={"writeMode": "upsert"}),
    DocumentedOption("versionColumn", "version", extra={"writeMode": "upsert", "upsertKeys": "id"}),
    DocumentedOption("batchIdColumn", "written_by_batch"),
    DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
    DocumentedOption("protocol", "auto"),
    DocumentedOption("createTableIfNotExists", "true"),
    DocumentedOption("ledgerTable", "public.contract_ledger"),
    DocumentedOption("sinkId", "contract_documented_options"),
    DocumentedOption("lockTimeout", "30s"),
    DocumentedOption("mergeSchema", "true"),
)


class PreparedPostgresSink(PostgresSink):
    protocol = "prepared"


class StagingPostgresSink(PostgresSink):
    protocol = "staging"


class JdbcPrepared(SinkAdapter):
    name = "jdbc-prepared"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ("postgres",)
    calls = CallFaults(
        decide="jdbc.decide",
        commit_piece="jdbc.commit_piece",
        prepare="jdbc.prepare",
        every=(
            "jdbc.prepare",
            "jdbc.find_decision",
            "jdbc.decide",
            "jdbc.fence",
            "jdbc.commit_piece",
        ),
    )
    documented_options = POSTGRES_OPTIONS
    option_changes = (
        OptionChange("url_libpq_form", lambda s, o: _jdbc_url_forms(s, o, "libpq")),
        OptionChange("url_with_parameters", lambda s, o: _jdbc_url_forms(s, o, "parameters")),
        OptionChange("url_localhost", lambda s, o: _jdbc_url_forms(s, o, "localhost")),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
        OptionChange("lockTimeout", _switch("lockTimeout", "45s"), chaos_only=True),
        OptionChange("protocol_to_staging", _switch("protocol", "staging")),
        OptionChange(
            "protocol_back_to_prepared",
            _switch("protocol", "prepared"),
            follows="protocol_to_staging",
        ),
    )
    timeout_not_applicable = (
        "a PostgreSQL prepared transaction has no timeout: it waits for COMMIT PREPARED"
        " however slow the batch (lockTimeout bounds lock waits, not prepared work)"
    )
    bound = PreparedPostgresSink


class JdbcStaging(SinkAdapter):
    name = "jdbc-staging"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ("postgres",)
    crash_points = ("after_prepare", "before_decision", "after_decision", "after_commit")
    default_crash_point = "after_decision"
    calls = CallFaults(
        decide="jdbc.decide",
        commit_piece=None,
        prepare=None,
        every=("jdbc.find_decision", "jdbc.decide", "jdbc.fence"),
    )
    documented_options = POSTGRES_OPTIONS
    option_changes = (
        OptionChange("url_libpq_form", lambda s, o: _jdbc_url_forms(s, o, "libpq")),
        OptionChange("url_with_parameters", lambda s, o: _jdbc_url_forms(s, o, "parameters")),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
        OptionChange("protocol_to_prepared", _switch("protocol", "prepared")),
        OptionChange(
            "protocol_back_to_staging",
            _switch("protocol", "staging"),
            follows="protocol_to_prepared",
        ),
    )
    timeout_not_applicable = (
        "staged rows are committed rows of a table: nothing times out between the tasks'"
        " COPY and the driver's move"
    )
    bound = StagingPostgresSink


class SqliteSink(JdbcSink):
    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.database = tmp_path / "contract.sqlite"
        self.table = name

    def base_options(self) -> Options:
        return {
            "url": f"jdbc:sqlite:{self.database}",
            "dbtable": self.table,
            "createTableIfNotExists": "true",
        }

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if not self.database.exists():
            return []
        with contextlib.closing(sqlite3.connect(self.database, timeout=60)) as connection:
            return connection.execute(sql, params).fetchall()

    def table_exists(self, name: str) -> bool:
        found = self.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return bool(found)

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        staged = self.staged_rows(sink_ids)
        return [f"{staged} staged rows"] if staged else []


def _sqlite_path_form(sink: BoundSink, options: Options) -> Options:
    database: Path = sink.database  # type: ignore[attr-defined]
    return {**options, "url": f"jdbc:sqlite:{database.parent}/./{database.name}"}


class JdbcSqlite(SinkAdapter):
    name = "jdbc-sqlite"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ()
    crash_points = JdbcStaging.crash_points
    default_crash_point = "after_decision"
    calls = JdbcStaging.calls
    documented_options = (
        DocumentedOption("url", lambda sink: f"jdbc:sqlite:{sink.database}"),  # type: ignore[attr-defined]
        DocumentedOption("dbtable", lambda sink: sink.table),  # type: ignore[attr-defined]
        DocumentedOption("batchsize", "7"),
        DocumentedOption("writeMode", "upsert", extra={"upsertKeys": "id"}),
        DocumentedOption("batchIdColumn", "written_by_batch"),
        DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
        DocumentedOption("protocol", "staging"),
        DocumentedOption("createTableIfNotExists", "true"),
        DocumentedOption("ledgerTable", "contract_ledger"),
        DocumentedOption("sinkId", "contract_documented_options"),
        DocumentedOption("mergeSchema", "true"),
    )
    option_changes = (
        OptionChange("url_same_file_another_path", _sqlite_path_form),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
    )
    timeout_not_applicable = JdbcStaging.timeout_not_applicable
    bound = SqliteSink


# 2pc-s3 --------------------------------------------------------------------------------
