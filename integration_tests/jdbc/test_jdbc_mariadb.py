"""2pc-jdbc into MariaDB (the embedded 10.11 server; MySQL 8 takes the same SQL) through
real streaming queries: append and upsert exactly once, values as Spark's JDBC writer
stores them, the url and option refusals, a crash of the query and a SIGKILL of the
server between two batches, each ending with exact row sets and nothing staged left."""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.cli import main
from eospack.connectors.jdbc.dialect import TableName, stage_table
from eospack.core import faults
from eospack.lab.testing import await_query, wait_until
from integration_tests.jdbc_fixtures import run_file_query, stream_input, write_input_files
from integration_tests.sink_contract.harness import ContractRun
from integration_tests.sink_contract.mariadb_adapter import MariaDBAdapter

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 120.0

APPEND_BATCHES = [
    [(1, "a", 1), (2, "", 1), (3, None, 1)],
    [(4, 'd,"quoted"\nline\twith\\backslash', 1), (5, "é🙂", 1)],
    [(6, "f", 1)],
]
UPSERT_BATCHES = [
    [(1, "one@1", 1), (2, "two@5", 5)],
    [(1, "one@3", 3), (2, "two@2", 2), (3, "three@1", 1)],
    [(1, "one@2", 2), (3, "three@4", 4), (3, "three@2", 2), (4, "four@1", 1)],
]
UPSERT_EXPECTED = [(1, "one@3", 3), (2, "two@5", 5), (3, "three@4", 4), (4, "four@1", 1)]


def sink_options(server: Any, table: str, **extra: str) -> dict[str, str]:
    options = {
        "url": server.endpoint.jdbc_url,
        "user": server.endpoint.user,
        "dbtable": table,
        "createTableIfNotExists": "true",
        **extra,
    }
    if server.endpoint.password:
        options["password"] = server.endpoint.password
    return options


def query(server: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    connection = server.endpoint.connect(init_command="SET SESSION time_zone = '+00:00'")
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params or None)
            return list(cursor.fetchall())
    finally:
        connection.close()


def rows(server: Any, table: str) -> list[tuple[Any, ...]]:
    return query(server, f"SELECT id, name, version FROM `{table}` ORDER BY id")


def staged_rows(server: Any, table: str) -> int:
    stage = stage_table(TableName(None, table)).name
    if not query(server, "SELECT 1 FROM information_schema.TABLES WHERE TABLE_NAME = %s", (stage,)):
        return 0
    return int(query(server, f"SELECT count(*) FROM `{stage}`")[0][0])


def ledger(server: Any, table: str) -> list[tuple[Any, ...]]:
    return query(
        server,
        "SELECT batch_id, `rows`, protocol, status FROM eospack_commits WHERE target = %s"
        " ORDER BY batch_id",
        (table,),
    )


def run_query(spark: Any, source: Path, checkpoint: Path, options: dict[str, str]) -> Any:
    running = (
        stream_input(spark, source)
        .writeStream.format("2pc-jdbc")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(running, QUERY_TIMEOUT)
    return running


@pytest.mark.timeout(300)
@pytest.mark.parametrize("write_mode", ["append", "upsert"])
def test_append_and_upsert_apply_every_row_exactly_once(
    spark, mariadb, tmp_path, unique_name, write_mode
):
    upsert = write_mode == "upsert"
    write_input_files(tmp_path / "in", UPSERT_BATCHES if upsert else APPEND_BATCHES)
    options = sink_options(mariadb, unique_name, writeMode=write_mode)
    if upsert:
        options.update(upsertKeys="id", versionColumn="version")

    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)

    expected = UPSERT_EXPECTED if upsert else sorted(r for b in APPEND_BATCHES for r in b)
    assert rows(mariadb, unique_name) == expected
    assert ledger(mariadb, unique_name) == [
        (0, 3 if not upsert else 2, "staging", "done"),
        (1, 2 if not upsert else 3, "staging", "done"),
        (2, 1 if not upsert else 4, "staging", "done"),
    ]
    assert staged_rows(mariadb, unique_name) == 0

    write_input_files(tmp_path / "in", [[(100, "late", 9)]])
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    assert rows(mariadb, unique_name) == sorted([*expected, (100, "late", 9)])
    assert staged_rows(mariadb, unique_name) == 0


UTC = datetime.timezone.utc
TYPES_DDL = (
    "id BIGINT, i INT, s SMALLINT, t TINYINT, b BOOLEAN, f FLOAT, d DOUBLE, m DECIMAL(38,10),"
    " txt STRING, bin BINARY, day DATE, at TIMESTAMP, wall TIMESTAMP_NTZ"
)
TYPES_ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("i", pa.int32()),
        ("s", pa.int16()),
        ("t", pa.int8()),
        ("b", pa.bool_()),
        ("f", pa.float32()),
        ("d", pa.float64()),
        ("m", pa.decimal128(38, 10)),
        ("txt", pa.string()),
        ("bin", pa.binary()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("wall", pa.timestamp("us")),
    ]
)
TYPED_ROWS = [
    (
        1,
        -(2**31),
        -(2**15),
        -128,
        True,
        0.1,
        1 / 3,
        decimal.Decimal("1234567890123456789012345678.0123456789"),
        "tab\there\nnewline \\ backslash \x00 nul é🙂 \\N",
        b"\x00\t\n\\N\xff",
        datetime.date(1000, 1, 1),
        datetime.datetime(2026, 3, 29, 1, 30, 0, 123456, tzinfo=UTC),
        datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
    ),
    (
        2,
        2**31 - 1,
        2**15 - 1,
        127,
        False,
        -3.4e38,
        1e308,
        decimal.Decimal("-0.0000000001"),
        "",
        b"",
        datetime.date(2026, 11, 28),
        datetime.datetime(1970, 1, 1, tzinfo=UTC),
        datetime.datetime(2026, 1, 1),
    ),
    (3, None, None, None, None, None, None, None, None, None, None, None, None),
]


@pytest.mark.timeout(300)
def test_values_come_back_as_spark_jdbc_writer_stores_them(spark, mariadb, tmp_path, unique_name):
    """Every type the PostgreSQL dialect maps, with separators, escapes and NULLs, under a
    Spark session zone that is not UTC: integers and decimals exact, FLOAT single precision,
    timestamps the UTC instant at microsecond precision, NTZ timestamps as written."""
    source = tmp_path / "in"
    source.mkdir()
    columns = list(zip(*TYPED_ROWS, strict=True))
    pq.write_table(
        pa.table([list(c) for c in columns], schema=TYPES_ARROW), source / "part-0000.parquet"
    )
    previous_zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        running = (
            spark.readStream.schema(TYPES_DDL)
            .parquet(str(source))
            .writeStream.format("2pc-jdbc")
            .options(**sink_options(mariadb, unique_name))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        await_query(running, QUERY_TIMEOUT)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous_zone)

    # FLOAT through CAST: the text protocol would show the float's shortest text (0.1).
    listed = ", ".join("CAST(f AS DOUBLE)" if n == "f" else n for n in TYPES_ARROW.names)
    stored = query(mariadb, f"SELECT {listed} FROM `{unique_name}` ORDER BY id")
    expected = [
        tuple(
            None
            if value is None
            else int(value)
            if isinstance(value, bool)
            else float(pa.scalar(value, pa.float32()).as_py())
            if name == "f"
            else value.astimezone(UTC).replace(tzinfo=None)
            if name == "at"
            else value
            for name, value in zip(TYPES_ARROW.names, row, strict=True)
        )
        for row in TYPED_ROWS
    ]
    assert stored == expected
    declared = query(
        mariadb,
        "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (unique_name,),
    )
    assert dict(declared) == {
        "id": "bigint(20)",
        "i": "int(11)",
        "s": "smallint(6)",
        "t": "tinyint(4)",
        "b": "tinyint(1)",
        "f": "float",
        "d": "double",
        "m": "decimal(38,10)",
        "txt": "longtext",
        "bin": "longblob",
        "day": "date",
        "at": "datetime(6)",
        "wall": "datetime(6)",
    }
    assert staged_rows(mariadb, unique_name) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"url": "jdbc:mariadb://127.0.0.1:1/eospack?password=pw-never-shown"},
            "url contains a password: remove it from url and set the password option instead",
        ),
        (
            {"url": "jdbc:mysql://127.0.0.1:1/eospack?useSSL=true"},
            "url parameter 'useSSL' is not supported: use only user",
        ),
        (
            {"writeMode": "upsert", "upsertKeys": "name", "createTableIfNotExists": "false"},
            "upsertKeys (name) match no primary key or unique index",
        ),
    ],
    ids=["password-in-url", "url-parameter", "upsert-key-without-index"],
)
@pytest.mark.timeout(180)
def test_bad_urls_and_options_fail_at_query_start_in_one_line(
    spark, mariadb, tmp_path, unique_name, extra, message
):
    query(mariadb, f"CREATE TABLE `{unique_name}` (id BIGINT, name LONGTEXT, version BIGINT)")
    write_input_files(tmp_path / "in", APPEND_BATCHES[:1])

    with pytest.raises(Exception) as caught:
        run_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            sink_options(mariadb, unique_name, **extra),
        )

    assert message in str(caught.value)
    assert "pw-never-shown" not in str(caught.value)
    assert rows(mariadb, unique_name) == []


@pytest.mark.timeout(300)
def test_a_decision_whose_answer_is_lost_fails_the_run_and_the_restart_is_exact(
    request, tmp_path, unique_name, call_faults
):
    """The driver's decision for batch 1 applied but its answer was lost (as if the driver
    died right after it): the run fails, the restart finishes batch 1 from the ledger."""
    sink = MariaDBAdapter.open(request, tmp_path, unique_name)
    run = ContractRun(sink)
    run.add_batches(3)
    faults.arm(call_faults, "jdbc.decide", "after", batch_id=1)

    assert run.run_through_fault() is not None
    run.assert_nothing_doubled()
    run.run_here()

    run.assert_each_row_once()


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_driver_killed_after_its_decision_restarts_with_exactly_the_input(
    request, tmp_path, unique_name
):
    """The driver SIGKILLed right after batch 1's decision: the restart finishes it from
    the ledger, and `eospack checkpoint inspect` reads the MariaDB ledger."""
    sink = MariaDBAdapter.open(request, tmp_path, unique_name)
    run = ContractRun(sink)
    run.add_batches(3)

    assert run.run_driver(fault_point="after_decision@1").was_killed
    run.assert_nothing_doubled()
    run.run_here()

    run.assert_each_row_once()
    endpoint = sink.server.endpoint  # type: ignore[attr-defined]
    arguments = ["checkpoint", "inspect", run.checkpoint.as_uri(), "--json"]
    arguments += ["--format", "2pc-jdbc", "--option", f"url={endpoint.jdbc_url}"]
    arguments += ["--option", f"dbtable={unique_name}", "--option", f"user={endpoint.user}"]
    capture = request.getfixturevalue("capsys")
    assert main(arguments) == 0
    report = json.loads(capture.readouterr().out)
    (sink_report,) = report["sinks"]
    assert [row["status"] for row in sink_report["batches"]] == ["done"] * 3
    assert sink_report["staged_rows"] == 0
    assert sink_report["cleanup"] == "nothing to clean"


@pytest.mark.timeout(300)
def test_mariadbd_sigkilled_between_batches_fails_clearly_and_the_restart_is_exact(
    request, tmp_path, unique_name
):
    from eospack.lab.services.mariadb import EmbeddedMariaDB

    server = EmbeddedMariaDB()
    try:
        sink = MariaDBAdapter.open(request, tmp_path, unique_name)
        sink.server = server  # type: ignore[attr-defined]
        run = ContractRun(sink)
        run.add_batches(12)

        running = run.start_here()

        def two_batches_done() -> bool:
            run.remember_sink_id()
            return sum(s == "done" for s in sink.decisions(run.sink_ids, run.options).values()) >= 2

        wait_until(two_batches_done, 60, "two committed batches")
        server.kill()
        with pytest.raises(Exception) as caught:
            await_query(running, 120)
        message = f"{caught.value}\n{getattr(caught.value, '_stackTrace', '')}"
        assert "jdbc:mariadb://" in message and (
            "could not connect to" in message or "connection error" in message
        ), message[:2000]

        server.start()
        run.remember_sink_id()
        run.assert_nothing_doubled()
        run.run_here()
        run.assert_each_row_once()
    finally:
        server.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("write_mode", ["append", "upsert"])
def test_a_server_refusing_local_files_gets_multi_row_inserts_with_the_same_rows(
    spark, tmp_path, unique_name, write_mode
):
    """MySQL 8's default ``local_infile=OFF``: the tasks fall back to multi-row INSERT."""
    from eospack.lab.services.mariadb import EmbeddedMariaDB

    server = EmbeddedMariaDB()
    try:
        query(server, "SET GLOBAL local_infile = 0")
        upsert = write_mode == "upsert"
        write_input_files(tmp_path / "in", UPSERT_BATCHES if upsert else APPEND_BATCHES)
        options = sink_options(server, unique_name, writeMode=write_mode, batchsize="2")
        if upsert:
            options.update(upsertKeys="id", versionColumn="version")

        run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)

        expected = UPSERT_EXPECTED if upsert else sorted(r for b in APPEND_BATCHES for r in b)
        assert rows(server, unique_name) == expected
        assert [status for *_, status in ledger(server, unique_name)] == ["done"] * 3
        assert staged_rows(server, unique_name) == 0
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_an_xa_piece_prepared_before_a_mariadbd_sigkill_survives_it_and_commits(unique_name):
    """What protocol=prepared relies on: a piece's ``XA PREPARE`` outlives its session and
    a SIGKILL of the server; after the restart ``XA RECOVER`` lists it and ``XA COMMIT``
    makes exactly its rows visible (a piece rolled back instead leaves none)."""
    from eospack.connectors.jdbc.mariadb import SESSION_SETUP, MariaDBConnection, MariaDBDialect
    from eospack.lab.services.mariadb import EmbeddedMariaDB

    dialect = MariaDBDialect()
    server = EmbeddedMariaDB()
    try:
        query(server, f"CREATE TABLE `{unique_name}` (id BIGINT, name LONGTEXT)")
        gids = [f"eospack-{'a' * 20}-7-{p}-1x{'b' * 12}x{p:08d}" for p in (0, 1)]
        for partition, gid in enumerate(gids):
            raw = server.endpoint.connect(local_infile=True, init_command=SESSION_SETUP)
            connection = MariaDBConnection(raw)
            dialect.leave_autocommit(connection)
            dialect.begin_prepared(connection, gid)
            batch = pa.record_batch({"id": [partition, partition + 10], "name": ["x", "y"]})
            table = TableName(None, unique_name)
            assert dialect.write_rows(connection, table, ["id", "name"], [batch], 100) == 2
            dialect.prepare(connection)
            connection.close()
        server.kill()
        server.start()
        raw = server.endpoint.connect(init_command=SESSION_SETUP)
        connection = MariaDBConnection(raw)
        try:
            assert dialect.prepared_gids(connection, "eospack-") == sorted(gids)
            assert dialect.finish_prepared(connection, gids[0], "COMMIT")
            assert dialect.finish_prepared(connection, gids[1], "ROLLBACK")
            assert not dialect.finish_prepared(connection, gids[0], "COMMIT"), "gone"
            assert dialect.prepared_gids(connection, "eospack-") == []
        finally:
            connection.close()
        assert query(server, f"SELECT id, name FROM `{unique_name}` ORDER BY id") == [
            (0, "x"),
            (10, "y"),
        ]
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_an_xa_leftover_on_the_table_fails_the_alter_after_lock_timeout_naming_it(
    spark, mariadb, tmp_path, unique_name
):
    """A crashed run's prepared XA piece holds locks on the target that ``ADD COLUMN`` waits
    for: the restart with ``mergeSchema`` and a new column fails after ``lockTimeout`` (not
    InnoDB's 50 s) in one line naming the XA piece, and adds nothing; once the piece is
    rolled back, the restart adds the column and writes every row once."""
    from eospack.connectors.jdbc.mariadb import SESSION_SETUP, MariaDBConnection, MariaDBDialect

    options = sink_options(mariadb, unique_name, protocol="prepared")
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    old = pa.table({"id": pa.array([1, 2], pa.int64()), "name": pa.array(["a", "b"])})
    new = pa.table(
        {"id": pa.array([3], pa.int64()), "name": ["c"], "note": pa.array(["x3"], pa.string())}
    )
    source.mkdir()
    pq.write_table(old, source / "part-0000.parquet")
    run_file_query(spark, source, checkpoint, "id BIGINT, name STRING", options)
    pq.write_table(new, source / "part-0001.parquet")

    dialect = MariaDBDialect()
    gid = f"eospack-{'c' * 20}-9-0-1x{'d' * 12}x00000000"
    leftover = MariaDBConnection(
        mariadb.endpoint.connect(local_infile=True, init_command=SESSION_SETUP)
    )
    dialect.leave_autocommit(leftover)
    dialect.begin_prepared(leftover, gid)
    leftover.execute(f"INSERT INTO `{unique_name}` (id, name) VALUES (100, 'left')")
    dialect.prepare(leftover)
    leftover.close()
    merged = {**options, "mergeSchema": "true", "lockTimeout": "1s"}
    try:
        with pytest.raises(Exception, match="locked by another session for over 1000ms") as caught:
            run_file_query(spark, source, checkpoint, NEW_FILE_SCHEMA, merged)
        assert f"(prepared XA pieces of eospack sinks: {gid})" in str(caught.value)
        assert "XA ROLLBACK" in str(caught.value)
        assert "note" not in [row[0] for row in _columns(mariadb, unique_name)]
    finally:
        checker = MariaDBConnection(mariadb.endpoint.connect(init_command=SESSION_SETUP))
        try:
            if gid in dialect.prepared_gids(checker, "eospack-"):
                dialect.finish_prepared(checker, gid, "ROLLBACK")
        finally:
            checker.close()

    run_file_query(spark, source, checkpoint, NEW_FILE_SCHEMA, merged)
    assert query(mariadb, f"SELECT id, name, note FROM `{unique_name}` ORDER BY id") == [
        (1, "a", None),
        (2, "b", None),
        (3, "c", "x3"),
    ]


NEW_FILE_SCHEMA = "id BIGINT, name STRING, note STRING"


def _columns(server: Any, table: str) -> list[tuple[Any, ...]]:
    return query(
        server,
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_NAME = %s",
        (table,),
    )
