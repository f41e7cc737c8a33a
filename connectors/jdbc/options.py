"""Options of ``format("2pc-jdbc")``, parsed once into a frozen, typed object.

Names follow Spark's JDBC data source where one exists (``url``, ``dbtable``, ``user``,
``password``, ``batchsize``); Spark hands them over lower-cased, so every lookup is
case-insensitive. The password is kept out of reprs and errors, and a password inside
``url`` is refused: the URL is shown in query plans, options named ``password`` are not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from eospack.commit_protocols.sink_options import parse_sink_common_options
from eospack.connectors.jdbc.dialect import Dialect, DialectName, TableName, check_identifier
from eospack.connectors.jdbc.errors import JdbcSinkOptionError
from eospack.connectors.jdbc.postgres import PostgresDialect
from eospack.connectors.jdbc.sqlite import SqliteDialect

WriteMode = Literal["append", "upsert"]
Protocol = Literal["auto", "prepared", "staging"]

DEFAULT_BATCHSIZE = 10_000
DEFAULT_LEDGER_TABLE = "eospack_commits"
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10
DEFAULT_LOCK_TIMEOUT_MS = 120_000
APPLICATION_NAME = "eospack 2pc-jdbc"
"""How the sink's sessions show in pg_stat_activity (the url's application_name wins)."""
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "min": 60_000, "m": 60_000, "h": 3_600_000}
URL_FORMS = (
    "jdbc:postgresql://host:port/database, postgresql://host:port/database or jdbc:sqlite:PATH"
)

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

    @property
    def target(self) -> str:
        """What the sink id is derived from together with the query id: the table."""
        return f"{self.url.database or self.url.path}/{self.table}"

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
        if self.user:
            kwargs["user"] = self.user
        if self.password:
            kwargs["password"] = self.password
        return kwargs


class _Options:
    """Case-insensitive view of the raw options."""

    def __init__(self, raw: Mapping[str, str]) -> None:
        self._values = {str(key).lower(): value for key, value in raw.items()}

    def get(self, name: str) -> str | None:
        value = self._values.get(name.lower())
        return None if value is None or str(value).strip() == "" else str(value).strip()

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(name)
        if value is None:
            return default
        if value.lower() not in choices:
            raise JdbcSinkOptionError(
                f"{name} {value!r} is not supported: use one of {', '.join(choices)}"
            )
        return value.lower()

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if value.lower() not in ("true", "false"):
            raise JdbcSinkOptionError(f"{name} {value!r} is not a boolean: use true or false")
        return value.lower() == "true"


def parse_url(value: str | None) -> tuple[DatabaseUrl, str | None]:
    """The database URL and the user it names (if any); refuses passwords in it."""
    if value is None:
        raise JdbcSinkOptionError(f"option url is required: set url to {URL_FORMS}")
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
    if scheme not in ("postgresql", "postgres") or not rest[len(scheme) :].startswith("://"):
        shown = scheme or "(none)"
        raise JdbcSinkOptionError(f"url scheme {shown!r} is not supported: use {URL_FORMS}")
    parts = urlsplit(rest)
    parameters = dict(parse_qsl(parts.query, keep_blank_values=True))
    if parts.password is not None or "password" in {key.lower() for key in parameters}:
        raise JdbcSinkOptionError(
            "url contains a password: remove it from url and set the password option instead"
            " (the url is shown in query plans)"
        )
    unknown = sorted(key for key in parameters if key not in _URL_PARAMETERS)
    if unknown:
        raise JdbcSinkOptionError(
            f"url parameter {unknown[0]!r} is not supported: use only "
            + ", ".join(sorted(_URL_PARAMETERS))
        )
    try:
        port = parts.port or 5432
    except ValueError as error:
        raise JdbcSinkOptionError(
            f"url has an invalid port: use {URL_FORMS} with a numeric port"
        ) from error
    database = unquote(parts.path.lstrip("/"))
    if not parts.hostname or not database:
        raise JdbcSinkOptionError(f"url needs a host and a database name: use {URL_FORMS}")
    user = parameters.pop("user", None) or (unquote(parts.username) if parts.username else None)
    url = DatabaseUrl(
        "postgresql", parts.hostname, port, database, parameters=tuple(sorted(parameters.items()))
    )
    return url, user


def parse_options(raw: Mapping[str, str]) -> JdbcSinkOptions:
    """Validate every option once; raise ``JdbcSinkOptionError`` naming the option and fix."""
    options = _Options(raw)
    url, url_user = parse_url(options.get("url"))
    table_value = options.get("dbtable")
    if table_value is None:
        raise JdbcSinkOptionError(
            "option dbtable is required: set dbtable=<table> or dbtable=<schema>.<table>"
        )
    table = TableName.parse(table_value, "dbtable")
    ledger = TableName.parse(options.get("ledgerTable") or DEFAULT_LEDGER_TABLE, "ledgerTable")

    batchsize_value = options.get("batchsize")
    batchsize = DEFAULT_BATCHSIZE
    if batchsize_value is not None:
        try:
            batchsize = int(batchsize_value)
        except ValueError:
            batchsize = 0
        if batchsize <= 0:
            raise JdbcSinkOptionError(
                f"batchsize {batchsize_value!r} is not a positive integer:"
                f" set e.g. batchsize={DEFAULT_BATCHSIZE}"
            )

    write_mode = options.choice("writeMode", ("append", "upsert"), "append")
    keys_value = options.get("upsertKeys")
    version_column = options.get("versionColumn")
    upsert_keys: tuple[str, ...] = ()
    if write_mode == "upsert":
        if keys_value is None:
            raise JdbcSinkOptionError(
                "writeMode=upsert needs upsertKeys: set upsertKeys=<column>[,<column>...]"
            )
        upsert_keys = tuple(key.strip() for key in keys_value.split(","))
        for key in upsert_keys:
            check_identifier(key, "upsertKeys column")
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
            f"{name} only applies to writeMode=upsert: set writeMode=upsert or remove {name}"
        )

    batch_id_column = options.get("batchIdColumn")
    if batch_id_column is not None:
        check_identifier(batch_id_column, "batchIdColumn")
        if batch_id_column in upsert_keys:
            raise JdbcSinkOptionError(
                f"batchIdColumn {batch_id_column!r} is one of the upsertKeys: name a new column"
            )

    common = parse_sink_common_options(
        options.get("deliveryGuarantee"), options.get("sinkId"), JdbcSinkOptionError
    )
    protocol = options.choice("protocol", ("auto", "prepared", "staging"), "auto")
    if protocol == "prepared" and not dialect_for(url).supports_prepared_transactions:
        raise JdbcSinkOptionError(
            "protocol=prepared needs PostgreSQL (SQLite has no prepared transactions):"
            " use protocol=staging or auto"
        )

    user = options.get("user") or url_user
    return JdbcSinkOptions(
        url=url,
        table=table,
        user=user,
        password=options.get("password"),
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
        lock_timeout_ms=_duration_ms(
            "lockTimeout", options.get("lockTimeout"), DEFAULT_LOCK_TIMEOUT_MS
        ),
    )


def _duration_ms(name: str, value: str | None, default: int) -> int:
    """A positive duration such as 500ms, 30s or 2min (a bare number is milliseconds)."""
    if value is None:
        return default
    match = re.fullmatch(r"(\d+)\s*([a-z]*)", value.lower())
    unit = (match.group(2) or "ms") if match else ""
    if match is None or unit not in _DURATION_UNITS_MS or int(match.group(1)) <= 0:
        raise JdbcSinkOptionError(
            f"{name} {value!r} is not a duration: use e.g. {name}=500ms, 30s or 2min"
        )
    return int(match.group(1)) * _DURATION_UNITS_MS[unit]
