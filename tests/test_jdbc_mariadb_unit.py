"""MariaDB/MySQL urls and the MariaDB dialect's SQL text (pure; the server:
integration_tests/jdbc/test_jdbc_mariadb.py)."""

from __future__ import annotations

import pyarrow as pa
import pymysql
import pytest
from pyspark.sql import types as T

from eospack.connectors.jdbc.dialect import TableName
from eospack.connectors.jdbc.errors import JdbcSchemaError, JdbcSinkOptionError
from eospack.connectors.jdbc.mariadb import (
    MariaDBDialect,
    _gid_of,
    _prepared,
    _text_column,
    _xid,
)
from eospack.connectors.jdbc.options import dialect_for, parse_options

SECRET = "topsecret"


@pytest.mark.parametrize("scheme", ["mariadb", "mysql", "MySQL"])
def test_both_jdbc_schemes_pick_the_mariadb_dialect_with_port_3306(scheme: str) -> None:
    options = parse_options({"url": f"jdbc:{scheme}://db.example/shop", "dbtable": "orders"})

    assert (options.url.dialect, options.url.host, options.url.port) == (
        "mariadb",
        "db.example",
        3306,
    )
    assert isinstance(dialect_for(options.url), MariaDBDialect)
    assert options.protocol == "auto"
    assert options.describe() == "jdbc:mariadb://db.example:3306/shop table orders"


def test_the_user_comes_from_the_url_or_the_option_and_the_password_only_from_its_option() -> None:
    from_url = parse_options({"url": "jdbc:mariadb://h:3307/db?user=alice", "dbtable": "t"})
    option = parse_options(
        {"url": "jdbc:mysql://h/db", "dbtable": "t", "user": "bob", "password": SECRET}
    )

    assert from_url.user == "alice" and from_url.url.port == 3307
    assert (option.user, option.password) == ("bob", SECRET)
    assert SECRET not in repr(option) and SECRET not in option.describe()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            f"jdbc:mariadb://alice:{SECRET}@h/db",
            "url contains a password: remove it from url and set the password option instead"
            " (the url is shown in query plans)",
        ),
        (
            f"jdbc:mysql://h/db?password={SECRET}",
            "url contains a password: remove it from url and set the password option instead"
            " (the url is shown in query plans)",
        ),
        (
            "jdbc:mariadb://h/db?useSSL=true",
            "url parameter 'useSSL' is not supported: use only user",
        ),
        ("mysql://h/db", "url scheme 'mysql' is not supported: use "),
        ("jdbc:mariadb://h:port/db", "url has an invalid port: use "),
        ("jdbc:mariadb://h/", "url needs a host and a database name: use "),
    ],
)
def test_bad_mariadb_urls_fail_in_one_line_without_the_password(url: str, message: str) -> None:
    with pytest.raises(JdbcSinkOptionError) as caught:
        parse_options({"url": url, "dbtable": "t"})

    assert str(caught.value).startswith(message)
    assert SECRET not in str(caught.value) and "\n" not in str(caught.value)


def test_protocol_prepared_is_xa_on_mariadb_and_not_auto_s_choice() -> None:
    prepared = parse_options({"url": "jdbc:mariadb://h/db", "dbtable": "t", "protocol": "prepared"})
    assert prepared.protocol == "prepared"
    assert MariaDBDialect.supports_prepared_transactions
    assert not MariaDBDialect.auto_uses_prepared


def test_xa_refuses_upsert_in_one_line_naming_the_fix() -> None:
    with pytest.raises(JdbcSinkOptionError) as caught:
        parse_options(
            {
                "url": "jdbc:mysql://h/db",
                "dbtable": "t",
                "protocol": "prepared",
                "writeMode": "upsert",
                "upsertKeys": "id",
            }
        )
    assert str(caught.value).startswith(
        "protocol=prepared (XA) on MariaDB/MySQL takes writeMode=append only (got writeMode=upsert)"
    )
    assert "protocol=staging" in str(caught.value) and "\n" not in str(caught.value)


def test_xa_ids_split_a_long_piece_id_into_gtrid_and_bqual_and_join_back() -> None:
    gid = "eospack-" + "s" * 20 + "-123456-7-1x0123456789abx0123abcd-and-more-to-pass-64-bytes"
    gtrid, bqual = _xid(gid)
    assert len(gtrid) == 64 and gtrid + bqual == gid
    assert _gid_of((1, 64, len(bqual), (gtrid + bqual).encode())) == gid


def test_upsert_guards_every_column_by_the_version_and_assigns_the_version_last() -> None:
    sql = MariaDBDialect().move_from_stage_sql(
        TableName(None, "t"), TableName(None, "s"), ["id", "version", "name"], ("id",), "version", 2
    )

    newer = '"t"."version" IS NULL OR "t"."version" < VALUES("version")'
    assert sql == (
        'INSERT INTO "t" ("id", "version", "name") SELECT "id", "version", "name" FROM "s"'
        ' WHERE "eospack_piece" IN (%s, %s) ORDER BY "id" ON DUPLICATE KEY UPDATE'
        f' "name" = IF({newer}, VALUES("name"), "t"."name"),'
        f' "version" = IF({newer}, VALUES("version"), "t"."version")'
    )


def test_created_tables_are_innodb_with_indexable_string_keys() -> None:
    schema = T.StructType(
        [
            T.StructField("key", T.StringType()),
            T.StructField("blob_key", T.BinaryType()),
            T.StructField("text", T.StringType()),
            T.StructField("at", T.TimestampType()),
            T.StructField("amount", T.DecimalType(38, 10)),
        ]
    )

    sql = MariaDBDialect().create_table_sql(TableName("db", "t"), schema, ("key", "blob_key"))

    assert sql == (
        'CREATE TABLE IF NOT EXISTS "db"."t" ("key" VARCHAR(255) CHARACTER SET utf8mb4 COLLATE'
        ' utf8mb4_bin, "blob_key" VARBINARY(255), "text" LONGTEXT CHARACTER SET utf8mb4 COLLATE'
        ' utf8mb4_bin, "at" DATETIME(6), "amount" DECIMAL(38,10),'
        ' PRIMARY KEY ("key", "blob_key")) ENGINE=InnoDB'
    )


def test_load_data_text_escapes_separators_and_writes_null_as_backslash_n() -> None:
    text, is_hex = _text_column(pa.array(["a\tb", "c\nd", "e\\f", "g\x00", None, ""]))
    hexed, binary = _text_column(pa.array([b"\x00\t\n", None], pa.binary()))

    assert text.to_pylist() == ["a\\tb", "c\\nd", "e\\\\f", "g\\0", "\\N", ""]
    assert not is_hex
    assert (hexed.to_pylist(), binary) == (["00090a", "\\N"], True)


def test_zoned_timestamps_go_as_utc_wall_clock_and_nan_is_refused() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "at": pa.array([0, 1_500_000], pa.timestamp("us", tz="Asia/Kolkata")),
            "ok": pa.array([True, None]),
        }
    )

    prepared = _prepared(batch, ["at", "ok"], TableName(None, "t"))

    assert _text_column(prepared.column(0))[0].to_pylist() == [
        "1970-01-01 00:00:00.000000",
        "1970-01-01 00:00:01.500000",
    ]
    assert _text_column(prepared.column(1))[0].to_pylist() == ["1", "\\N"]
    nan = pa.RecordBatch.from_pydict({"x": pa.array([1.0, float("nan")])})
    with pytest.raises(JdbcSchemaError, match="column 'x' of 't' holds NaN or an infinity"):
        _prepared(nan, ["x"], TableName(None, "t"))


def test_names_with_a_percent_sign_are_refused_naming_them() -> None:
    options = parse_options({"url": "jdbc:mariadb://h/db", "dbtable": "t"})
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("a%b", T.LongType())])

    with pytest.raises(JdbcSchemaError, match="name 'a%b' contains '%'"):
        MariaDBDialect().refuse_lossy_columns(options, schema, {})
    MariaDBDialect().refuse_lossy_columns(options, T.StructType(schema.fields[:1]), {})


class _RefusingXaRecover:
    def execute(self, statement: str, params: object = None) -> None:
        raise pymysql.err.OperationalError(1227, "Access denied; you need XA_RECOVER_ADMIN")


def test_a_user_refused_xa_recover_has_no_prepared_pieces_but_cannot_choose_xa() -> None:
    """MySQL 8 without XA_RECOVER_ADMIN: recovery of staging and at-least-once (which list
    prepared pieces too) must go on; protocol=prepared is refused at query start."""
    connection = _RefusingXaRecover()
    assert MariaDBDialect().prepared_gids(connection, "eospack-") == []  # type: ignore[arg-type]
    with pytest.raises(JdbcSinkOptionError, match="XA_RECOVER_ADMIN"):
        MariaDBDialect().max_prepared_transactions(connection)  # type: ignore[arg-type]
