"""The contract suite's 2pc-jdbc adapters for MariaDB (the embedded 10.11 server): the
staging protocol, which ``protocol=auto`` picks there (``jdbc-mariadb``), and XA
(``protocol=prepared``, ``jdbc-mariadb-xa``), modelled on the PostgreSQL adapters of
``jdbc_adapters.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eospack.commit_protocols.pieces import sink_prefix
from eospack.connectors.jdbc.mariadb import _gid_of
from integration_tests.sink_contract.base import (
    EXACTLY_ONCE,
    BoundSink,
    DocumentedOption,
    OptionChange,
    Options,
    SinkAdapter,
    _switch,
)
from integration_tests.sink_contract.jdbc_adapters import JdbcPrepared, JdbcSink, JdbcStaging

SESSION = (
    "SET SESSION sql_mode = CONCAT_WS(',', @@SESSION.sql_mode, 'ANSI_QUOTES'), time_zone = '+00:00'"
)
"""The double-quoted identifiers of the shared ``JdbcSink`` queries, as the sink's own
sessions have them."""


class MariaDBSink(JdbcSink):
    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.server = request.getfixturevalue("mariadb")
        self.table = name

    def base_options(self) -> Options:
        endpoint = self.server.endpoint
        options = {
            "url": endpoint.jdbc_url,
            "user": endpoint.user,
            "dbtable": self.table,
            "createTableIfNotExists": "true",
        }
        if endpoint.password:
            options["password"] = endpoint.password
        return options

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        connection = self.server.endpoint.connect(init_command=SESSION)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params or None)
                return list(cursor.fetchall())
        finally:
            connection.close()

    def table_exists(self, name: str) -> bool:
        return bool(
            self.query(
                "SELECT 1 FROM information_schema.TABLES"
                " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                (name,),
            )
        )

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        staged = self.staged_rows(sink_ids)
        return [f"{staged} staged rows"] if staged else []

    @contextlib.contextmanager
    def another_sink_mid_decision(self, options: Options) -> Iterator[None]:
        """Another sink's decision INSERT into the shared ledger, its transaction left open
        (InnoDB holds its row and gap locks until it ends)."""
        ledger = self.parsed(options).ledger_table
        connection = self.server.endpoint.connect(autocommit=False, init_command=SESSION)
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    f'INSERT INTO {ledger.sql()} (sink_id, batch_id, target, protocol, "rows",'
                    " status, pieces) VALUES ('another_sink_mid_decision', 0, %s, 'staging', 0,"
                    " 'decided', '[]')",
                    (self.table,),
                )
            yield
        finally:
            connection.rollback()
            connection.close()


def _mariadb_url_forms(sink: BoundSink, options: Options, form: str) -> Options:
    endpoint = sink.server.endpoint  # type: ignore[attr-defined]
    urls = {
        "mysql": endpoint.jdbc_url.replace("jdbc:mariadb:", "jdbc:mysql:"),
        "user_in_url": f"{endpoint.jdbc_url}?user={endpoint.user}",
        "localhost": endpoint.jdbc_url.replace(endpoint.host, "localhost"),
    }
    return {**options, "url": urls[form]}


class MariaDBAdapter(SinkAdapter):
    name = "jdbc-mariadb"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ("mariadb",)
    crash_points = JdbcStaging.crash_points
    default_crash_point = JdbcStaging.default_crash_point
    calls = JdbcStaging.calls
    documented_options = (
        DocumentedOption("url", lambda sink: sink.server.endpoint.jdbc_url),  # type: ignore[attr-defined]
        DocumentedOption("dbtable", lambda sink: sink.table),  # type: ignore[attr-defined]
        DocumentedOption("user", lambda sink: sink.server.endpoint.user),  # type: ignore[attr-defined]
        DocumentedOption("password", lambda sink: sink.server.endpoint.password or ""),  # type: ignore[attr-defined]
        DocumentedOption("batchsize", "7"),
        DocumentedOption("writeMode", "upsert", extra={"upsertKeys": "id"}),
        DocumentedOption("upsertKeys", "id", extra={"writeMode": "upsert"}),
        DocumentedOption(
            "versionColumn", "version", extra={"writeMode": "upsert", "upsertKeys": "id"}
        ),
        DocumentedOption("batchIdColumn", "written_by_batch"),
        DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
        DocumentedOption("protocol", "auto"),
        DocumentedOption("createTableIfNotExists", "true"),
        DocumentedOption("ledgerTable", "eospack.contract_ledger"),
        DocumentedOption("sinkId", "contract_documented_options"),
        DocumentedOption("lockTimeout", "30s"),
        DocumentedOption("mergeSchema", "true"),
    )
    option_changes = (
        OptionChange("url_mysql_scheme", lambda s, o: _mariadb_url_forms(s, o, "mysql")),
        OptionChange("url_user_in_url", lambda s, o: _mariadb_url_forms(s, o, "user_in_url")),
        OptionChange("url_localhost", lambda s, o: _mariadb_url_forms(s, o, "localhost")),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
        OptionChange("lockTimeout", _switch("lockTimeout", "45s"), chaos_only=True),
    )
    timeout_not_applicable = JdbcStaging.timeout_not_applicable
    bound = MariaDBSink


class MariaDBXASink(MariaDBSink):
    """``protocol=prepared``: its leftovers are the XA transactions ``XA RECOVER`` lists."""

    def base_options(self) -> Options:
        return {**super().base_options(), "protocol": "prepared"}

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        prefixes = tuple(sink_prefix(sink_id) for sink_id in sink_ids)
        prepared = [
            f"XA transaction {gid}"
            for gid in (_gid_of(row) for row in self.query("XA RECOVER"))
            if gid.startswith(prefixes)
        ]
        return [*prepared, *super().leftovers(sink_ids, options)]


class MariaDBXAAdapter(SinkAdapter):
    name = "jdbc-mariadb-xa"
    sink_format = "2pc-jdbc"
    data_source = "eospack.connectors.jdbc.sink:TwoPhaseJdbcDataSource"
    fixtures = ("mariadb",)
    calls = JdbcPrepared.calls
    documented_options = tuple(
        DocumentedOption("protocol", "prepared") if option.name == "protocol" else option
        for option in MariaDBAdapter.documented_options
        if option.name not in {"writeMode", "upsertKeys", "versionColumn"}
    )
    """XA takes appends only (an upsert is refused at query start: ``options``)."""
    option_changes = (
        OptionChange("url_mysql_scheme", lambda s, o: _mariadb_url_forms(s, o, "mysql")),
        OptionChange("url_localhost", lambda s, o: _mariadb_url_forms(s, o, "localhost")),
        OptionChange("batchsize", _switch("batchsize", "3"), chaos_only=True),
        OptionChange("protocol_to_staging", _switch("protocol", "staging")),
        OptionChange(
            "protocol_back_to_prepared",
            _switch("protocol", "prepared"),
            follows="protocol_to_staging",
        ),
    )
    timeout_not_applicable = (
        "a prepared XA transaction has no timeout: it waits for XA COMMIT however slow the"
        " batch (lockTimeout bounds lock waits, not prepared work)"
    )
    bound = MariaDBXASink
