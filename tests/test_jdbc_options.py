"""2pc-jdbc without Spark or a database: option parsing, every option error (exact
messages), identifier quoting, type mapping and the SQL the sink generates."""

from __future__ import annotations

import os

import psycopg
import pytest
from pyspark.sql import types as T

from eospack.connectors.jdbc.dialect import TableName, quote, stage_table
from eospack.connectors.jdbc.errors import (
    JdbcIdentifierError,
    JdbcSchemaError,
    JdbcSinkOptionError,
    JdbcWriteError,
)
from eospack.connectors.jdbc.mariadb import MariaDBDialect
from eospack.connectors.jdbc.options import JdbcSinkOptions, parse_options
from eospack.connectors.jdbc.postgres import PostgresDialect
from eospack.connectors.jdbc.sink import _ConnectionErrors
from eospack.connectors.jdbc.sqlite import SqliteDialect

BASE = {"url": "jdbc:postgresql://db.example:5433/shop", "dbtable": "sales.orders"}
PASSWORD = "s3cret-value"


def parse(**extra: str) -> JdbcSinkOptions:
    # A plain dict: the options reader makes its names case-insensitive, as Spark's are.
    return parse_options({**BASE, **extra})


def error_of(**extra: str) -> str:
    with pytest.raises(JdbcSinkOptionError) as caught:
        parse(**extra)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_defaults() -> None:
    options = parse()
    assert options.url.dialect == "postgresql"
    assert (options.url.host, options.url.port, options.url.database) == (
        "db.example",
        5433,
        "shop",
    )
    assert options.table == TableName("sales", "orders")
    assert options.batchsize == 10_000
    assert options.write_mode == "append" and options.upsert_keys == ()
    assert options.exactly_once and options.protocol == "auto"
    assert options.create_table is False
    assert options.ledger_table == TableName(None, "eospack_commits")
    assert options.sink_id is None
    assert options.merge_schema is False


def test_every_option_parsed_case_insensitively() -> None:
    options = parse_options(
        {
            "URL": "postgresql://alice@db.example/shop?sslmode=require",
            "DbTable": "orders",
            "password": PASSWORD,
            "BATCHSIZE": "500",
            "writemode": "UPSERT",
            "upsertkeys": "id, region",
            "versioncolumn": "version",
            "deliveryguarantee": "at-least-once",
            "protocol": "staging",
            "createtableifnotexists": "TRUE",
            "ledgertable": "audit.commits",
            "sinkid": "orders_v2",
            "checkpointlocation": "/tmp/cp",
            "locktimeout": "2min",
            "mergeschema": "True",
        }
    )
    assert options.user == "alice" and options.url.port == 5432
    assert options.url.parameters == (("sslmode", "require"),)
    assert options.batchsize == 500
    assert options.write_mode == "upsert" and options.upsert_keys == ("id", "region")
    assert options.version_column == "version"
    assert not options.exactly_once and options.protocol == "staging"
    assert options.create_table
    assert options.ledger_table == TableName("audit", "commits")
    assert options.sink_id == "orders_v2" and options.lock_timeout_ms == 120_000
    assert options.psycopg_kwargs()["password"] == PASSWORD
    assert options.merge_schema is True


def test_password_never_in_repr_or_description() -> None:
    options = parse(password=PASSWORD, user="bob")
    assert PASSWORD not in repr(options)
    assert PASSWORD not in options.describe()
    assert options.describe() == "postgresql://db.example:5433/shop table sales.orders"


def test_sqlite_url_is_made_absolute() -> None:
    options = parse(url="jdbc:sqlite:data/sink.db")
    assert options.url.dialect == "sqlite"
    assert options.url.path == os.path.abspath("data/sink.db")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"url": "mysql://u:topsecret@h/db"},
            "url scheme 'mysql' is not supported: use jdbc:postgresql://host:port/database,"
            " postgresql://host:port/database, jdbc:mariadb://host:port/database,"
            " jdbc:mysql://host:port/database or jdbc:sqlite:PATH",
        ),
        (
            {"url": "jdbc:postgresql://alice:topsecret@h/db"},
            "url contains a password: remove it from url and set the password option instead"
            " (the url is shown in query plans)",
        ),
        (
            {"url": "jdbc:postgresql://h/db?user=a&password=topsecret"},
            "url contains a password: remove it from url and set the password option instead"
            " (the url is shown in query plans)",
        ),
        (
            {"url": "jdbc:postgresql://h/db?ssl=true"},
            "url parameter 'ssl' is not supported: use only application_name, connect_timeout,"
            " gssencmode, options, sslcert, sslkey, sslmode, sslrootcert, target_session_attrs,"
            " user",
        ),
        (
            {"url": "jdbc:postgresql://h:port/db"},
            "url has an invalid port: use jdbc:postgresql://host:port/database,"
            " postgresql://host:port/database, jdbc:mariadb://host:port/database,"
            " jdbc:mysql://host:port/database or jdbc:sqlite:PATH with a numeric port",
        ),
        (
            {"url": "jdbc:postgresql://h:5432/"},
            "url needs a host and a database name: use jdbc:postgresql://host:port/database,"
            " postgresql://host:port/database, jdbc:mariadb://host:port/database,"
            " jdbc:mysql://host:port/database or jdbc:sqlite:PATH",
        ),
        (
            {"url": "jdbc:sqlite::memory:"},
            "url jdbc:sqlite: needs a database file that the driver and every task share:"
            " set url=jdbc:sqlite:/path/to/file.db",
        ),
        (
            {"url": "jdbc:sqlite:/tmp/x.db", "protocol": "prepared"},
            "protocol=prepared needs PostgreSQL, MariaDB or MySQL (SQLite has no prepared"
            " transactions): use protocol=staging or auto",
        ),
        ({"batchsize": "0"}, "Option batchsize is '0': use a positive integer"),
        (
            {"lockTimeout": "soon"},
            "Option lockTimeout is 'soon': use a duration such as 500ms, 30s, 2min or 1h",
        ),
        (
            {"lockTimeout": "0s"},
            "Option lockTimeout is '0s': use a positive duration such as 500ms, 30s, 2min or 1h",
        ),
        ({"batchsize": "ten"}, "Option batchsize is 'ten': use a positive integer"),
        (
            {"writeMode": "merge"},
            "Option writeMode is 'merge': use append (default), upsert or changes",
        ),
        (
            {"writeMode": "upsert"},
            "writeMode=upsert needs upsertKeys: set upsertKeys=<column>[,<column>...]",
        ),
        (
            {"upsertKeys": "id"},
            "upsertKeys only applies to writeMode=upsert or changes: set writeMode=upsert (or"
            " changes) or remove upsertKeys",
        ),
        (
            {"versionColumn": "v"},
            "versionColumn only applies to writeMode=upsert or changes: set writeMode=upsert (or"
            " changes) or remove versionColumn",
        ),
        (
            {"writeMode": "changes", "upsertKeys": "id"},
            "writeMode=changes needs versionColumn (a value that grows with each change of a"
            " key, e.g. Debezium's source.lsn or ts_ms, or the Kafka offset when the topic is"
            " keyed by the key columns): set versionColumn=<column>",
        ),
        (
            {"writeMode": "changes", "versionColumn": "v"},
            "writeMode=changes needs upsertKeys: set upsertKeys=<column>[,<column>...]",
        ),
        (
            {"writeMode": "changes", "upsertKeys": "id", "versionColumn": "v", "deleteOps": "d,u"},
            "deleteOps and updateOps both list the operation 'u': give each value to one of"
            " insertOps, updateOps, deleteOps",
        ),
        (
            {"writeMode": "changes", "upsertKeys": "id", "versionColumn": "v", "opColumn": "id"},
            "opColumn 'id' is also named by upsertKeys: the op column is not stored in the"
            " target, so name a different column",
        ),
        (
            {
                "writeMode": "changes",
                "upsertKeys": "id",
                "versionColumn": "v",
                "insertOps": ",",
                "updateOps": ",",
                "deleteOps": ",",
            },
            "insertOps, updateOps and deleteOps are all empty: list the operation values of the"
            " op column (Debezium: insertOps=c,r updateOps=u deleteOps=d)",
        ),
        (
            {"writeMode": "append", "opColumn": "op"},
            "opColumn only applies to writeMode=changes: set writeMode=changes or remove opColumn",
        ),
        (
            {"writeMode": "upsert", "upsertKeys": "id", "versionColumn": "id"},
            "versionColumn 'id' is one of the upsertKeys: use a separate column that grows with"
            " each update",
        ),
        (
            {"writeMode": "upsert", "upsertKeys": "id", "batchIdColumn": "id"},
            "batchIdColumn 'id' is one of the upsertKeys: name a new column",
        ),
        (
            {"batchIdColumn": 'bad"name'},
            "batchIdColumn 'bad\"name' contains a double quote or a control character, so it"
            " cannot be quoted safely as an SQL identifier: rename it (letters, digits,"
            " underscores)",
        ),
        (
            {"deliveryGuarantee": "exactly_once"},
            "Option deliveryGuarantee is 'exactly_once': use exactly-once (default) or"
            " at-least-once",
        ),
        ({"protocol": "xa"}, "Option protocol is 'xa': use auto (default), prepared or staging"),
        (
            {"createTableIfNotExists": "yes"},
            "Option createTableIfNotExists is 'yes': use true or false",
        ),
        ({"mergeSchema": "1"}, "Option mergeSchema is '1': use true or false"),
        (
            {"sinkId": "my-sink"},
            "Option sinkId is 'my-sink': use 1 to 64 letters, digits or underscores",
        ),
        (
            {"dbtable": "a.b.c"},
            "dbtable 'a.b.c' has more than one dot: use <table> or <schema>.<table>",
        ),
        (
            {"ledgerTable": "bad\tname"},
            "ledgerTable part 'bad\\tname' contains a double quote or a control character, so it"
            " cannot be quoted safely as an SQL identifier: rename it (letters, digits,"
            " underscores)",
        ),
    ],
)
def test_bad_options_fail_with_one_line_naming_the_option(extra, message) -> None:
    text = error_of(**extra)
    assert text == message
    assert "topsecret" not in text


def test_change_options_default_to_debeziums_operations() -> None:
    options = parse(writeMode="changes", upsertKeys="id", versionColumn="lsn")
    assert (options.op_column, options.insert_ops, options.update_ops, options.delete_ops) == (
        "op",
        ("c", "r"),
        ("u",),
        ("d",),
    )
    custom = parse(
        writeMode="changes",
        upsertKeys="id",
        versionColumn="lsn",
        opColumn="kind",
        insertOps="I, S",
        updateOps="U",
        deleteOps="D",
    )
    assert (custom.op_column, custom.insert_ops, custom.update_ops, custom.delete_ops) == (
        "kind",
        ("I", "S"),
        ("U",),
        ("D",),
    )
    assert parse().op_column is None


def test_missing_url_and_dbtable() -> None:
    with pytest.raises(JdbcSinkOptionError) as caught:
        parse_options({"dbtable": "t"})
    assert str(caught.value) == (
        "Option url is required: set url to jdbc:postgresql://host:port/database,"
        " postgresql://host:port/database, jdbc:mariadb://host:port/database,"
        " jdbc:mysql://host:port/database or jdbc:sqlite:PATH"
    )
    with pytest.raises(JdbcSinkOptionError) as caught:
        parse_options({"url": BASE["url"]})
    assert str(caught.value) == (
        "Option dbtable is required: set dbtable to <table> or <schema>.<table>"
    )


@pytest.mark.parametrize("name", ["", " padded", "x" * 64, 'a"b', "nul\x00", "line\nbreak"])
def test_names_that_cannot_be_quoted_safely_are_refused(name: str) -> None:
    with pytest.raises(JdbcIdentifierError):
        quote(name)


def test_names_are_quoted_and_case_kept() -> None:
    assert quote("Order Lines") == '"Order Lines"'
    assert TableName.parse("Sales.Orders", "dbtable").sql() == '"Sales"."Orders"'
    stage = stage_table(TableName("sales", "orders"))
    assert stage.schema == "sales" and stage.name.startswith("orders_eospack_stage_")
    assert len(stage.name.encode()) <= 63


def test_type_mapping_and_refusals() -> None:
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("amount", T.DecimalType(12, 2)),
            T.StructField("at", T.TimestampType()),
            T.StructField("flag", T.BooleanType()),
        ]
    )
    assert PostgresDialect().create_table_sql(TableName(None, "t"), schema, ("id",)) == (
        'CREATE TABLE IF NOT EXISTS "t" ("id" bigint, "amount" numeric(12,2),'
        ' "at" timestamp with time zone, "flag" boolean, PRIMARY KEY ("id"))'
    )
    with pytest.raises(JdbcSchemaError) as caught:
        PostgresDialect().column_type(T.StructField("tags", T.ArrayType(T.StringType())))
    assert str(caught.value) == (
        "column 'tags' has type array<string>, which 2pc-jdbc cannot store: cast it to a"
        " supported type first (e.g. to_json(col) for arrays, maps, structs)"
    )


def test_upsert_sql_never_moves_a_version_backwards() -> None:
    statement = PostgresDialect().move_from_stage_sql(
        TableName(None, "t"),
        TableName(None, "s"),
        ["id", "v", "name"],
        ("id",),
        "v",
        2,
    )
    assert statement == (
        'INSERT INTO "t" AS eospack_target ("id", "v", "name") SELECT DISTINCT ON ("id")'
        ' "id", "v", "name" FROM "s" WHERE "eospack_piece" = ANY(%s) ORDER BY "id",'
        ' "v" DESC NULLS LAST ON CONFLICT ("id") DO UPDATE SET "v" = excluded."v",'
        ' "name" = excluded."name" WHERE eospack_target."v" IS NULL'
        ' OR eospack_target."v" < excluded."v"'
    )


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
            "2pc-jdbc lost db during commit: connection error (terminating connection due to"
            " administrator command); once the database is back, restart the query from its"
            " checkpoint: exactly-once holds",
        ),
        (
            psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
            "2pc-jdbc lost db during commit: waited longer than lockTimeout for a row lock"
            " (canceling statement due to lock timeout): two tasks of one batch write the same"
            " key (repartition by upsertKeys or use protocol=staging) or another writer holds it",
        ),
        (
            psycopg.errors.OutOfMemory("maximum number of prepared transactions reached"),
            "2pc-jdbc lost db during commit: maximum number of prepared transactions reached:"
            " raise max_prepared_transactions on the server above the tasks of one batch,"
            " coalesce the DataFrame, or use protocol=staging",
        ),
    ],
)
def test_database_errors_are_classified_by_sqlstate(error: Exception, message: str) -> None:
    with (
        pytest.raises(JdbcWriteError) as caught,
        _ConnectionErrors("2pc-jdbc lost db during commit"),
    ):
        raise error
    assert str(caught.value) == message
    with pytest.raises(psycopg.errors.UniqueViolation), _ConnectionErrors("context"):
        raise psycopg.errors.UniqueViolation("duplicate key")


@pytest.mark.parametrize("name", ["sinkId", "ledgerTable"])
def test_a_blank_identity_option_is_refused_not_taken_for_the_default(name: str) -> None:
    """A blank sinkId or ledgerTable would silently mean "derived" or the default ledger: a
    restart with it would look for its decisions elsewhere and apply a batch again."""
    with pytest.raises(JdbcSinkOptionError, match=f"^Option {name} is blank: leave it unset"):
        parse(**{name: " "})


@pytest.mark.parametrize(
    ("declared", "spark_type", "accepted"),
    [
        ("bigint", T.LongType(), True),
        ("integer", T.DoubleType(), True),  # narrowed as Spark's JDBC writer does
        ("numeric(12,2)", T.DecimalType(38, 2), True),
        ("bigint", T.StringType(), True),  # parsed by the column (documented)
        ("bigint", T.DateType(), False),
        ("bigint", T.BooleanType(), False),
        ("numeric(12,2)", T.TimestampType(), False),
        ("integer[]", T.LongType(), True),  # no known family: left to the database
        ("interval", T.LongType(), True),
        ("text", T.LongType(), True),  # the exact text of a number
        ("character varying(20)", T.StringType(), True),
        ("text", T.BinaryType(), False),
        ("text", T.TimestampType(), True),
        ("bytea", T.LongType(), False),
        ("bytea", T.BinaryType(), True),
        ("date", T.TimestampType(), True),  # keeps its UTC day (documented)
        ("date", T.LongType(), False),
        ("timestamp with time zone", T.DateType(), True),
        ("timestamp(3) without time zone", T.TimestampNTZType(), True),
        ("boolean", T.IntegerType(), False),
        ("tinyint(1)", T.BooleanType(), True),
        ("jsonb", T.StringType(), True),
    ],
)
def test_a_retyped_column_is_told_by_the_declared_types_family(
    declared: str, spark_type: T.DataType, accepted: bool
) -> None:
    assert PostgresDialect().accepts(declared, spark_type) is accepted


@pytest.mark.parametrize(
    ("declared", "spark_type", "accepted"),
    [
        ("INTEGER", T.StringType(), False),
        ("REAL", T.StringType(), False),
        ("INTEGER", T.BooleanType(), True),
        ("TEXT", T.LongType(), True),
        ("TEXT", T.BinaryType(), False),
        ("BLOB", T.StringType(), True),
        ("", T.StringType(), True),
        ("DATE", T.StringType(), True),  # NUMERIC affinity keeps text that is no number
        ("VARCHAR(10)", T.DateType(), True),
    ],
)
def test_sqlite_tells_a_retyped_column_by_affinity(
    declared: str, spark_type: T.DataType, accepted: bool
) -> None:
    assert SqliteDialect().accepts(declared, spark_type) is accepted


def test_merge_schema_adds_a_nullable_column_idempotently() -> None:
    table = TableName("sales", "orders")
    assert PostgresDialect().add_column_sql(table, "note", "text") == (
        'ALTER TABLE "sales"."orders" ADD COLUMN IF NOT EXISTS "note" text'
    )
    assert SqliteDialect().add_column_sql(TableName(None, "t"), "note", "TEXT") == (
        'ALTER TABLE "t" ADD COLUMN "note" TEXT'
    )


def test_changes_are_refused_on_a_database_without_the_change_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every dialect has the hooks today; a new one starts without them."""

    monkeypatch.setattr(MariaDBDialect, "supports_changes", False)
    with pytest.raises(JdbcSinkOptionError) as caught:
        parse_options(
            {
                "url": "jdbc:mariadb://db.example:3306/shop",
                "dbtable": "orders",
                "writeMode": "changes",
                "upsertKeys": "id",
                "versionColumn": "lsn",
            }
        )
    assert str(caught.value) == (
        "writeMode=changes is not supported on mariadb yet: use PostgreSQL or SQLite, or"
        " writeMode=upsert"
    )
