"""Options of ``format("2pc-jdbc")``, parsed once into a frozen, typed object.

Names follow Spark's JDBC data source where one exists (``url``, ``dbtable``, ``user``,
``password``, ``batchsize``); they are read through ``eospack.core.options.OptionReader``
(case-insensitive names, one grammar per kind of value). The password is kept out of reprs
and errors, and a password inside ``url`` is refused: the URL is shown in query plans,
options named ``password`` are not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from eospack.core.options import OptionReader

from ...commit_protocols.sink_options import parse_sink_common_options
from .dialect import Dialect, DialectName, TableName, check_identifier
from .errors import JdbcSinkOptionError
from .mariadb import MariaDBDialect
from .postgres import PostgresDialect
from .sqlite import SqliteDialect

WriteMode = Literal["append", "upsert", "changes"]
Protocol = Literal["auto", "prepared", "staging"]

DEFAULT_BATCHSIZE = 10_000
DEFAULT_LEDGER_TABLE = "eospack_commits"
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10
DEFAULT_LOCK_TIMEOUT_MS = 120_000
DEFAULT_OP_COLUMN = "op"
DEFAULT_INSERT_OPS = ("c", "r")
DEFAULT_UPDATE_OPS = ("u",)
DEFAULT_DELETE_OPS = ("d",)
"""Debezium's operation codes: create, read (snapshot), update, delete."""
APPLICATION_NAME = "eospack 2pc-jdbc"
"""How the sink's sessions show in pg_stat_activity (the url's application_name wins)."""
URL_FORMS = (
    "jdbc:postgresql://host:port/database, postgresql://host:port/database,"
    " jdbc:mariadb://host:port/database, jdbc:mysql://host:port/database or jdbc:sqlite:PATH"
)
MARIADB_SCHEMES = ("mariadb", "mysql")
_PASSWORD_ASSIGNMENT = re.compile(r"password\s*=", re.IGNORECASE)
MARIADB_DEFAULT_PORT = 3306
_MARIADB_URL_PARAMETERS = frozenset({"user"})
"""What a jdbc:mariadb:// or jdbc:mysql:// url may carry besides the server and database
(the password goes in the password option; the sink sets the session itself)."""

# libpq connection parameters accepted in the URL's query string.
_URL_PARAMETERS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "application_name",
        "connect_timeout",
        "options",
        "target_session_attrs",
        "gssencmode",
        "user",
    }
)


@dataclass(frozen=True)
class DatabaseUrl:
    """Where the database is; never holds a password (see ``JdbcSinkOptions.password``)."""

    dialect: DialectName
    host: str = ""
    port: int = 5432
    database: str = ""
    path: str = ""
    parameters: tuple[tuple[str, str], ...] = ()

    def display(self) -> str:
        return dialect_for(self).display_url(self)


_DIALECTS: dict[DialectName, Dialect] = {
    "postgresql": PostgresDialect(),
    "sqlite": SqliteDialect(),
    "mariadb": MariaDBDialect(),
}


def dialect_for(url: DatabaseUrl) -> Dialect:
    """The database behind a parsed URL: the one place that maps a URL to its ``Dialect``."""
    return _DIALECTS[url.dialect]


@dataclass(frozen=True)
class JdbcSinkOptions:
    url: DatabaseUrl
    table: TableName
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    batchsize: int = DEFAULT_BATCHSIZE
    write_mode: WriteMode = "append"
    upsert_keys: tuple[str, ...] = ()
    version_column: str | None = None
    batch_id_column: str | None = None
    """A column the sink adds and fills with each row's micro-batch id (audit trails)."""
    exactly_once: bool = True
    protocol: Protocol = "auto"
    create_table: bool = False
    ledger_table: TableName = field(default_factory=lambda: TableName(None, DEFAULT_LEDGER_TABLE))
    sink_id: str | None = None
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    """How long a task waits for a row lock before its batch fails (PostgreSQL)."""
    merge_schema: bool = False
    """``mergeSchema`` (Delta's name): add the DataFrame's new columns to the target (and
    its staging table) as nullable columns at query start, instead of refusing them."""
    op_column: str | None = None
    """``writeMode=changes``: the DataFrame column holding each change's operation; it is
    staged but never stored in the target."""
    insert_ops: tuple[str, ...] = ()
    update_ops: tuple[str, ...] = ()
    delete_ops: tuple[str, ...] = ()
    """``writeMode=changes``: the operation values; disjoint (checked at parse time)."""

    @property
    def stored_columns_exclude(self) -> frozenset[str]:
        """DataFrame columns the sink never writes into the target (the op column)."""
        return frozenset((self.op_column,)) if self.op_column else frozenset()

    @property
    def target(self) -> str:
        """What the sink id is derived from together with the query id: the database and
        the table, spelled one way however ``dbtable`` names it. A schema that is the
        database's default (``public`` on PostgreSQL, the url's database on MariaDB/MySQL,
        ``main`` on SQLite) is dropped, so a restart naming ``public.orders`` instead of
        ``orders`` is the same sink and finds its decisions (else it would apply a replayed
        batch a second time)."""
        table = self.table
        if table.schema is not None and table.schema == dialect_for(self.url).default_schema(
            self.url
        ):
            table = TableName(None, table.name)
        return f"{self.url.database or self.url.path}/{table}"

    def describe(self) -> str:
        """For logs and errors: where rows go, without any credential."""
        return f"{self.url.display()} table {self.table}"

    def psycopg_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``psycopg.connect`` (the only place the password goes)."""
        kwargs: dict[str, Any] = {
            "host": self.url.host,
            "port": self.url.port,
            "dbname": self.url.database,
            "connect_timeout": DEFAULT_CONNECT_TIMEOUT_SECONDS,
            "application_name": APPLICATION_NAME,
        }
        kwargs.update(dict(self.url.parameters))
        kwargs["client_encoding"] = "UTF8"  # rows go as UTF-8, whatever the database's encoding
        if self.user:
            kwargs["user"] = self.user
        if self.password:
            kwargs["password"] = self.password
        return kwargs


def parse_url(value: str) -> tuple[DatabaseUrl, str | None]:
    """The database URL and the user it names (if any); refuses passwords in it."""
    if value.lower().startswith("jdbc:sqlite:"):
        path = value[len("jdbc:sqlite:") :]
        if not path or path.startswith(":memory:") or path.startswith("file::memory"):
            raise JdbcSinkOptionError(
                "url jdbc:sqlite: needs a database file that the driver and every task share:"
                " set url=jdbc:sqlite:/path/to/file.db"
            )
        return DatabaseUrl("sqlite", path=os.path.abspath(path)), None
    rest = value[len("jdbc:") :] if value.lower().startswith("jdbc:") else value
    scheme = rest.split(":", 1)[0].lower() if ":" in rest else ""
    # MariaDB and MySQL only in their JDBC form (no libpq-style mysql:// url exists).
    jdbc_prefixed = value.lower().startswith("jdbc:")
    known = ("postgresql", "postgres", *(MARIADB_SCHEMES if jdbc_prefixed else ()))
    if scheme not in known or not rest[len(scheme) :].startswith("://"):
        shown = scheme or "(none)"
        raise JdbcSinkOptionError(f"url scheme {shown!r} is not supported: use {URL_FORMS}")
    parts = urlsplit(rest)
    parameters = dict(parse_qsl(parts.query, keep_blank_values=True))
    # Also MariaDB Connector/J's address=(...)(password=...) form and a ;password= suffix,
    # which urlsplit reads as part of the host or the database name (both logged and shown).
    if (
        parts.password is not None
        or "password" in {key.lower() for key in parameters}
        or _PASSWORD_ASSIGNMENT.search(rest)
    ):
        raise JdbcSinkOptionError(
            "url contains a password: remove it from url and set the password option instead"
            " (the url is shown in query plans)"
        )
    mariadb = scheme in MARIADB_SCHEMES
    allowed = _MARIADB_URL_PARAMETERS if mariadb else _URL_PARAMETERS
    unknown = sorted(key for key in parameters if key not in allowed)
    if unknown:
        raise JdbcSinkOptionError(
            f"url parameter {unknown[0]!r} is not supported: use only " + ", ".join(sorted(allowed))
        )
    try:
        port = parts.port or (MARIADB_DEFAULT_PORT if mariadb else 5432)
    except ValueError as error:
        raise JdbcSinkOptionError(
            f"url has an invalid port: use {URL_FORMS} with a numeric port"
        ) from error
    database = unquote(parts.path.lstrip("/"))
    if not parts.hostname or not database:
        raise JdbcSinkOptionError(f"url needs a host and a database name: use {URL_FORMS}")
    user = parameters.pop("user", None) or (unquote(parts.username) if parts.username else None)
    url = DatabaseUrl(
        "mariadb" if mariadb else "postgresql",
        parts.hostname,
        port,
        database,
        parameters=tuple(sorted(parameters.items())),
    )
    return url, user


def parse_options(raw: Mapping[str, str]) -> JdbcSinkOptions:
    """Validate every option once; raise ``JdbcSinkOptionError`` naming the option and fix."""
    options = OptionReader(raw, JdbcSinkOptionError)
    url, url_user = parse_url(options.required("url", URL_FORMS))
    table_value = options.required("dbtable", "<table> or <schema>.<table>")
    table = TableName.parse(table_value, "dbtable")
    ledger = TableName.parse(
        options.identity("ledgerTable", "table or schema.table", DEFAULT_LEDGER_TABLE),
        "ledgerTable",
    )
    batchsize = options.positive_int("batchsize", DEFAULT_BATCHSIZE)

    write_mode = options.choice("writeMode", ("append", "upsert", "changes"), "append")
    keys_value = options.text("upsertKeys")
    version_column = options.text("versionColumn")
    upsert_keys: tuple[str, ...] = ()
    if write_mode in ("upsert", "changes"):
        if keys_value is None:
            raise JdbcSinkOptionError(
                f"writeMode={write_mode} needs upsertKeys: set upsertKeys=<column>[,<column>...]"
            )
        upsert_keys = tuple(key.strip() for key in keys_value.split(","))
        for key in upsert_keys:
            check_identifier(key, "upsertKeys column")
        if version_column is None and write_mode == "changes":
            raise JdbcSinkOptionError(
                "writeMode=changes needs versionColumn (a value that grows with each change of"
                " a key, e.g. Debezium's source.lsn or ts_ms, or the Kafka offset when the topic"
                " is keyed by the key columns): set versionColumn=<column>"
            )
        if version_column is not None:
            check_identifier(version_column, "versionColumn")
            if version_column in upsert_keys:
                raise JdbcSinkOptionError(
                    f"versionColumn {version_column!r} is one of the upsertKeys:"
                    " use a separate column that grows with each update"
                )
    elif keys_value is not None or version_column is not None:
        name = "upsertKeys" if keys_value is not None else "versionColumn"
        raise JdbcSinkOptionError(
            f"{name} only applies to writeMode=upsert or changes: set writeMode=upsert"
            f" (or changes) or remove {name}"
        )
    change_options = _parse_change_options(options, write_mode, upsert_keys, version_column)

    batch_id_column = options.text("batchIdColumn")
    if batch_id_column is not None:
        check_identifier(batch_id_column, "batchIdColumn")
        if batch_id_column in upsert_keys:
            raise JdbcSinkOptionError(
                f"batchIdColumn {batch_id_column!r} is one of the upsertKeys: name a new column"
            )

    common = parse_sink_common_options(options)
    if write_mode == "changes" and not dialect_for(url).supports_changes:
        raise JdbcSinkOptionError(
            f"writeMode=changes is not supported on {dialect_for(url).name} yet:"
            " use PostgreSQL or SQLite, or writeMode=upsert"
        )
    protocol = options.choice("protocol", ("auto", "prepared", "staging"), "auto")
    if protocol == "prepared" and not dialect_for(url).supports_prepared_transactions:
        raise JdbcSinkOptionError(
            "protocol=prepared needs PostgreSQL, MariaDB or MySQL (SQLite has no prepared"
            " transactions): use protocol=staging or auto"
        )
    if protocol == "prepared" and url.dialect == "mariadb" and write_mode != "append":
        raise JdbcSinkOptionError(
            f"protocol=prepared (XA) on MariaDB/MySQL takes writeMode=append only (got"
            f" writeMode={write_mode}): an upsert inside a prepared XA transaction holds"
            " InnoDB's next-key locks until the commit, so parallel tasks wait on each other;"
            " use protocol=staging (or auto) for upsert and changes"
        )

    user = options.text("user") or url_user
    return JdbcSinkOptions(
        url=url,
        table=table,
        user=user,
        password=options.secret("password"),
        batchsize=batchsize,
        write_mode=write_mode,  # type: ignore[arg-type]
        upsert_keys=upsert_keys,
        version_column=version_column,
        batch_id_column=batch_id_column,
        exactly_once=common.exactly_once,
        protocol=protocol,  # type: ignore[arg-type]
        create_table=options.boolean("createTableIfNotExists", False),
        ledger_table=ledger,
        sink_id=common.sink_id,
        lock_timeout_ms=options.duration_ms("lockTimeout", DEFAULT_LOCK_TIMEOUT_MS, positive=True),
        merge_schema=options.boolean("mergeSchema", False),
        **change_options,
    )


_CHANGE_OPTIONS = ("opColumn", "insertOps", "updateOps", "deleteOps")


def _parse_change_options(
    options: OptionReader,
    write_mode: str,
    upsert_keys: tuple[str, ...],
    version_column: str | None,
) -> dict[str, Any]:
    """``opColumn`` and the operation value lists of ``writeMode=changes``.

    The lists are disjoint and non-empty values; an empty list is allowed (e.g.
    ``updateOps=`` for a stream of inserts and deletes only) as long as one value is left
    in all. Refused outside ``writeMode=changes``, where they would silently do nothing.
    """
    if write_mode != "changes":
        for name in _CHANGE_OPTIONS:
            if options.text(name) is not None:
                raise JdbcSinkOptionError(
                    f"{name} only applies to writeMode=changes: set writeMode=changes or"
                    f" remove {name}"
                )
        return {}
    op_column = options.text("opColumn", DEFAULT_OP_COLUMN)
    check_identifier(op_column, "opColumn")
    for option, names in (("upsertKeys", upsert_keys), ("versionColumn", (version_column,))):
        if op_column in names:
            raise JdbcSinkOptionError(
                f"opColumn {op_column!r} is also named by {option}: the op column is not"
                " stored in the target, so name a different column"
            )
    lists: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for name, default in (
        ("insertOps", DEFAULT_INSERT_OPS),
        ("updateOps", DEFAULT_UPDATE_OPS),
        ("deleteOps", DEFAULT_DELETE_OPS),
    ):
        value = options.text(name)
        values = (
            default if value is None else tuple(v.strip() for v in value.split(",") if v.strip())
        )
        for op in values:
            if op in seen:
                raise JdbcSinkOptionError(
                    f"{name} and {seen[op]} both list the operation {op!r}: give each value"
                    " to one of insertOps, updateOps, deleteOps"
                )
            seen[op] = name
        lists[name] = values
    if not seen:
        raise JdbcSinkOptionError(
            "insertOps, updateOps and deleteOps are all empty: list the operation values of"
            " the op column (Debezium: insertOps=c,r updateOps=u deleteOps=d)"
        )
    return {
        "op_column": op_column,
        "insert_ops": lists["insertOps"],
        "update_ops": lists["updateOps"],
        "delete_ops": lists["deleteOps"],
    }
